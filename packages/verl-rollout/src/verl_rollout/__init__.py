"""verl-rollout: generation engines for the rollout role (hf, vllm, sglang)."""
