"""The model and what loads it: the LLaMA network, its layers, presets, checkpoints and the tokenizer."""
