"""The layers of the model; each calls the active kernel set for its op."""
