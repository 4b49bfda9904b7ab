"""Running a scheduled step on the device: inputs, the model runner, CUDA graphs, decode one step ahead, warm-up."""
