"""Helpers shared by the test folders (imported as `tests.support.*`; the repository root is on the path).

- fixtures: `make_cfg` (the minimal valid config plus updates) and the pytest fixtures for the embedded tiny
  model, its character tokenizer, a session cache folder, random decoders of three shapes (the memory-model tests)
  and Ray clusters of 2, 3 and 4 CPUs (a test folder uses them by importing them into its conftest.py).
- engines: a random Llama folder, a one-process gloo group, engine-layout batches and the parity tests' PPO batch.
- run_configs: the tiny recipes shrunk to seconds for trainer tests, and a reward with spread.
- megatron_workers: random HF models, the parity batch and HF reference log-probs, and a bare Ray worker
  around megatron engines.
- fsdp_ranks: FSDP engines over several spawned processes (tp, cp, dp), each rank's outputs and step by value.

The rollout engine contract stays with the rollout tests (tests/rollout/engine_contract.py).
"""
