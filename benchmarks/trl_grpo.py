"""TRL's GRPOTrainer on the prepared run (the tiny model's or the real one's); started by vs_trl.py in TRL's own
virtualenv.

Writes one JSON line per step (wall time at its end, its seconds, prompt + completion tokens) and saves the
final model for vs_trl.py to evaluate."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="jsonl: prompt (rendered text), ground_truth")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--reward", default="arith_reward", help="the module whose trl_reward scores completions")
    a = p.parse_args()

    import importlib

    trl_reward = importlib.import_module(a.reward).trl_reward
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepLog(TrainerCallback):
        def __init__(self, path: str):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.f = open(path, "w")
            self.start, self.tokens = 0.0, 0

        def on_step_begin(self, args, state, control, **kw):
            self.start, self.tokens = time.perf_counter(), state.num_input_tokens_seen

        def on_step_end(self, args, state, control, **kw):
            row = {
                "step": state.global_step,
                "time": time.time(),
                "step_s": time.perf_counter() - self.start,
                "tokens": state.num_input_tokens_seen - self.tokens,
            }
            self.f.write(json.dumps(row) + "\n")
            self.f.flush()

    config = GRPOConfig(
        output_dir=a.out,
        per_device_train_batch_size=a.prompts * a.n,  # one step: all samples of `prompts` prompts, one mini-batch
        num_generations=a.n,
        max_completion_length=a.max_new,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        beta=0.0,  # no KL term, no reference model
        num_iterations=1,  # one epoch over each batch: on-policy
        gradient_accumulation_steps=1,
        max_steps=a.steps,
        temperature=1.0,
        seed=a.seed,
        bf16=False,
        activation_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
    )
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype="float32")
    data = load_dataset("json", data_files=a.data, split="train")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=config,
        train_dataset=data,
        processing_class=tok,
        callbacks=[StepLog(os.path.join(a.out, "steps.jsonl"))],
    )
    trainer.train()
    trainer.save_model(os.path.join(a.out, "final"))
    tok.save_pretrained(os.path.join(a.out, "final"))


if __name__ == "__main__":
    main()
