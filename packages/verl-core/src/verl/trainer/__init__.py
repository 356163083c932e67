"""Trainers: PPO/GRPO (`verl.trainer.ppo`) and SFT (`verl.trainer.sft`)."""
