"""verl-fsdp: the FSDP2 training engine for Hugging Face causal LMs."""
