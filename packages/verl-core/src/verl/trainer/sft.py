"""SFT: supervised fine-tuning on prompt/response pairs with the same train engines the RL roles use.

Used for the warm start of the embedded model, and on its own for any model and SFT parquet
(columns prompt: chat messages, response: text). Loss: token-mean negative log-likelihood of the
response tokens (and eos).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from verl.config.schema import OptimConfig
from verl.controller import Dispatch, ResourcePool, Worker, make_worker_group, register
from verl.data.loader import DataLoader
from verl.data.sampler import ResumableSampler
from verl.data.sft_dataset import SFTDataset, collate_sft
from verl.engine import EngineConfig, load_engine
from verl.protocol import DataProto
from verl.workers.setup import quiet_libraries, set_threads


@dataclass
class SFTConfig:
    model_path: str
    files: List[str]
    output_dir: str  # the Hugging Face folder written at the end
    tokenizer_path: Optional[str] = None  # None: the model's own
    steps: int = 200
    batch_size: int = 64
    max_length: int = 64
    backend: str = "fsdp"
    device: str = "cpu"
    controller: str = "ray"
    seed: int = 1
    log_every: int = 50
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0))


def engine_batch(batch: Dict[str, torch.Tensor]) -> DataProto:
    """Right-padded SFT rows in the engine's layout: every token after the first is a 'response' token,
    predicted from the logits before it, and counted where the loss mask says so."""
    return DataProto.from_dict(
        {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "position_ids": batch["position_ids"],
            "responses": batch["input_ids"][:, 1:],
            "response_mask": batch["loss_mask"][:, 1:],
        }
    )


def nll_loss(out: Dict[str, torch.Tensor], mb: DataProto):
    mask = mb.batch["response_mask"].to(out["log_probs"].dtype)
    loss = -(out["log_probs"] * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"loss": float(loss.detach())}


nll_loss.weight_by = "tokens"  # a token mean: micro-batches weigh their tokens (engine_parts.Accumulator)


class SFTWorker(Worker):
    def __init__(self, cfg: SFTConfig):
        super().__init__()
        self.cfg = cfg

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        quiet_libraries()
        set_threads(None)
        self.init_distributed("gloo" if self.cfg.device == "cpu" else "nccl")
        c = self.cfg
        engine_cfg = EngineConfig(
            model_path=c.model_path, optim=c.optim, total_steps=c.steps, device=c.device, seed=c.seed
        )
        self.engine = load_engine(c.backend, "train")(engine_cfg)

    @register(Dispatch.DP_COMPUTE)
    def train_step(self, batch: DataProto) -> Dict[str, float]:
        return self.engine.train_step(batch, nll_loss, micro_batch_size=len(batch))

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        self.engine.export_hf(path)


def run_sft(cfg: SFTConfig) -> Dict[str, float]:
    """Train for cfg.steps and write the model to cfg.output_dir; returns the last metrics."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path or cfg.model_path)
    data = SFTDataset(cfg.files, tokenizer, max_length=cfg.max_length)
    sampler = ResumableSampler(len(data), batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    loader = DataLoader(data, sampler, functools.partial(collate_sft, pad_id=tokenizer.pad_token_id))
    pool = ResourcePool(name="sft", nnodes=1, devices_per_node=1, device=cfg.device)
    group = make_worker_group(cfg.controller, pool, SFTWorker, cfg, role="sft")
    metrics: Dict[str, float] = {}
    try:
        group.call(SFTWorker.init_model)
        start = time.perf_counter()
        for step in range(1, cfg.steps + 1):
            (metrics,) = group.call(SFTWorker.train_step, engine_batch(loader.next_batch()))  # one dp rank
            if step % cfg.log_every == 0 or step == cfg.steps:
                print(
                    f"sft step {step}/{cfg.steps}: loss {metrics['loss']:.4f} ({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
        group.call(SFTWorker.export_hf, cfg.output_dir)
    finally:
        group.shutdown()
        pool.remove()  # (under Ray: the run that follows needs these CPUs for its own pools)
    return metrics
