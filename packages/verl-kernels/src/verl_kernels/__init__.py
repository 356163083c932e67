"""verl-kernels: fused log-prob/entropy from hidden states without materialising full-vocabulary logits."""
