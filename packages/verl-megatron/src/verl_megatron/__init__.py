"""verl-megatron: the megatron-core training engine (tensor, pipeline, context and expert parallel)."""
