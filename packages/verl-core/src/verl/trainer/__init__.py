"""Trainers: PPO/GRPO (`verl.trainer.ppo`), DPO (`verl.trainer.dpo`) and SFT (`verl.trainer.sft_trainer`);
`verl.trainer.registry` picks one from algorithm.name."""
