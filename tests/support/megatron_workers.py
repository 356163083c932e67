"""Helpers for megatron tests: random HF models, a parity batch and the HF reference log-probs, and a bare worker
around MegatronEngines for multi-process tests through the project's Ray groups."""

from __future__ import annotations

import types
from typing import Any, Dict, Optional

import torch

from verl.controller import Dispatch, Worker, register
from verl.engine_protocol import EngineConfig
from verl.protocol import DataProto
from verl.workers.setup import quiet_libraries, set_threads

# Mixtures of experts: 4 experts, top 2 (qwen3_moe: one dense layer among the routed ones, as mlp_only_layers).
MOE_SETTINGS: Dict[str, Dict[str, Any]] = {
    "qwen3_moe": dict(
        head_dim=6,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        norm_topk_prob=True,
        mlp_only_layers=[1],
    ),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}


def random_model_dir(
    path: str,
    model_type: str,
    *,
    tie: bool,
    layers: int = 4,
    vocab: int = 37,
    seed: int = 0,
    hidden: int = 16,
    **overrides: Any,
) -> str:
    """A random Llama / Qwen2 / Qwen3 (or Qwen3-MoE / Mixtral, `MOE_SETTINGS`) saved as an HF folder (GQA: 4 heads
    over 2 kv groups); `overrides` go to the config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra: Dict[str, Any] = {"head_dim": 6} if model_type == "qwen3" else {}  # head_dim apart from hidden/heads
    extra.update(MOE_SETTINGS.get(model_type, {}), **overrides)
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3 // 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        rms_norm_eps=1e-6,
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms start at 1 and biases at 0: randomise them so the round trip sees every tensor
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return path


LOGPROB_ATOL = 1e-5  # float32 on CPU; measured differences are ~5e-7 (reduction order in attention and norms)


def parity_batch(vocab: int, rows: int = 4, prompt: int = 6, response: int = 5, padded: bool = True) -> DataProto:
    """Rows with left-padded prompts and a response that ended early (padded=False: every token real)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    response_mask = torch.ones(rows, response, dtype=torch.long)
    if padded:
        mask[0, :3] = 0  # left-padded prompts
        mask[2, :1] = 0
        response_mask[1, 3:] = 0  # a response that ended early: right padding
    mask[:, prompt:] = response_mask
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:],
            "response_mask": response_mask,
        }
    )


def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def response_log_probs(model: Any, batch: DataProto) -> torch.Tensor:
    """An HF causal LM's log-probs of the batch's response tokens [B, R] (differentiable)."""
    b = batch.batch
    r = b["responses"].shape[1]
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    logp = torch.log_softmax(logits[:, -r - 1 : -1].float(), -1)
    return logp.gather(-1, b["responses"][..., None]).squeeze(-1)


def hf_log_probs(path: str, batch: DataProto) -> torch.Tensor:
    with torch.no_grad():
        return response_log_probs(hf_model(path), batch)


def hf_grad_norm(path: str, batch: DataProto) -> float:
    """Gradient norm of the mean response-token NLL (EngineWorker.train's loss) for the HF model."""
    model = hf_model(path)
    logp = response_log_probs(model, batch)
    (-logp[batch.batch["response_mask"].bool()].mean()).backward()
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()


def check_log_probs(results: list, path: str, batch: DataProto, atol: float = LOGPROB_ATOL) -> float:
    want = hf_log_probs(path, batch)
    valid = batch.batch["response_mask"].bool()
    worst = 0.0
    for out in results:  # every rank returns the last stage's outputs
        diff = (out["log_probs"] - want).abs()[valid].max().item()
        assert diff <= atol, diff
        worst = max(worst, diff)
    return worst


def hf_routes(path: str, batch) -> torch.Tensor:
    """HF's top-k experts of every token and routed layer, [B, S, layers, k] (experts sorted), for `batch`."""
    b = batch.batch
    with torch.no_grad():
        out = hf_model(path)(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
            output_router_logits=True,
        )
    rows, seq = b["input_ids"].shape
    from transformers import AutoConfig

    k = AutoConfig.from_pretrained(path).num_experts_per_tok
    layers = [logits.view(rows, seq, -1).topk(k, dim=-1).indices for logits in out.router_logits]
    return torch.stack(layers, dim=2).sort(dim=-1).values


def grouped_batch() -> DataProto:
    """parity_batch's rows as two prompts of two samples each (a GRPO batch): shared-prefix packing computes each
    prompt once for both its samples."""
    b = parity_batch(37).batch
    ids, mask = b["input_ids"].clone(), b["attention_mask"].clone()
    p = ids.shape[1] - b["responses"].shape[1]
    ids[1, :p], mask[1, :p] = ids[0, :p], mask[0, :p]
    ids[3, :p], mask[3, :p] = ids[2, :p], mask[2, :p]
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": b["responses"],
            "response_mask": b["response_mask"],
        }
    )


def check_recorded_routes(routes: torch.Tensor, path: str, batch: DataProto, layout: str) -> None:
    """`routes` are HF's top-k at every real position the pass computed; -1 where it computed nothing: `padded`
    rows compute every position (padding too), `thd` streams every real one, shared-prefix `packed` rows no padding
    and not a row's last real token (it predicts nothing)."""
    real = batch.batch["attention_mask"].bool()
    computed = torch.ones_like(real) if layout == "padded" else real.clone()
    if layout == "packed":
        computed[torch.arange(len(real)), real.long().cumsum(1).argmax(1)] = False
    assert routes.dtype == torch.int16 and routes.shape[:2] == real.shape
    assert torch.equal(routes[..., 0, 0] >= 0, computed)
    assert bool((routes[~computed] == -1).all())
    both = computed & real
    assert torch.equal(routes.sort(dim=-1).values.long()[both], hf_routes(path, batch)[both])


def _parallel(parallel: Dict[str, Any]) -> types.SimpleNamespace:
    defaults = {"tp": 1, "pp": 1, "vpp": None, "cp": 1, "ep": 1, "etp": None, "dp": None}
    return types.SimpleNamespace(**{**defaults, **parallel})


class EngineWorker(Worker):
    """Holds MegatronEngines by name; every method runs on every rank (megatron calls are collective)."""

    def __init__(self, parallel: Dict[str, Any]):
        self.parallel = _parallel(parallel)
        self.engines: Dict[str, Any] = {}

    @register(Dispatch.ONE_TO_ALL)
    def relayout(self, parallel: Dict[str, Any]) -> None:
        """Drop the engines and megatron's process groups; the next load uses `parallel`. Lets one group of
        workers (and one start-up) test several layouts of the same world size."""
        self.engines.clear()
        from verl_megatron.parallel import destroy_model_parallel

        destroy_model_parallel()
        self.parallel = _parallel(parallel)

    @register(Dispatch.ONE_TO_ALL)
    def load(
        self,
        name: str,
        model_path: str,
        optim: Optional[Any] = None,
        kind: str = "causal_lm",
        dtype: str = "float32",
        shared_prefix: bool = True,
        thd: Optional[bool] = None,
        gradient_checkpointing: bool = False,
    ) -> tuple:
        """thd: force the packed THD layout on or off (the engine takes it with TransformerEngine)."""
        quiet_libraries()
        set_threads(None)
        device = self.device.type  # the pool's: cuda on a GPU pool
        self.init_distributed("nccl" if device == "cuda" else "gloo")
        from verl.engine_protocol import load_engine

        cfg = EngineConfig(
            model_path=model_path,
            kind=kind,
            optim=optim,
            total_steps=10,
            device=device,
            dtype=dtype,
            parallel=self.parallel,
            shared_prefix=shared_prefix,
            gradient_checkpointing=gradient_checkpointing,
        )
        self.engines[name] = load_engine("megatron", "train")(cfg)
        if thd is not None:
            self.engines[name].thd = thd
        return self.engines[name].data_parallel_info()

    @register(Dispatch.ONE_TO_ALL)
    def hf_weights(self, name: str, gen_tp: int = 1) -> Dict[str, torch.Tensor]:
        return {k: v.cpu().clone() for k, v in self.engines[name].weights(gen_tp)}

    @register(Dispatch.ONE_TO_ALL)
    def hf_weight_digests(self, name: str) -> Dict[str, str]:
        """sha256 of each streamed (full) tensor's bytes: what a large model's bitwise check ships back."""
        import hashlib

        return {
            k: hashlib.sha256(v.cpu().contiguous().numpy().tobytes()).hexdigest()
            for k, v in self.engines[name].weights()
        }

    @register(Dispatch.ONE_TO_ALL)
    def infer(
        self,
        name: str,
        batch: DataProto,
        micro_batch_size: int = 2,
        max_tokens: Optional[int] = None,
        routes: bool = False,
    ) -> Dict[str, torch.Tensor]:
        engine = self.engines[name]
        out = engine.infer(batch, micro_batch_size=micro_batch_size, entropy=True, max_tokens=max_tokens, routes=routes)
        return {k: v.cpu() for k, v in out.batch.items()}

    @register(Dispatch.ONE_TO_ALL)
    def export(self, name: str, path: str) -> None:
        self.engines[name].export_hf(path)

    @register(Dispatch.ONE_TO_ALL)
    def train(
        self, name: str, batch: DataProto, micro_batch_size: int = 2, max_tokens: Optional[int] = None
    ) -> Dict[str, float]:
        def nll(out, mb):
            mask = mb.batch["response_mask"]
            loss = -(out["log_probs"] * mask).sum() / mask.sum()
            return loss, {"nll": float(loss)}

        nll.weight_by = "tokens"  # a token mean: micro-batches weigh their tokens, however the batch is cut
        return self.engines[name].train_step(batch, nll, micro_batch_size=micro_batch_size, max_tokens=max_tokens)

    @register(Dispatch.ONE_TO_ALL)
    def save(self, name: str, path: str) -> None:
        self.engines[name].save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def held_bytes(self, name: str) -> Dict[str, int]:
        return self.engines[name].held_bytes()

    @register(Dispatch.ONE_TO_ALL)
    def send_shards(self, name: str, host: str, port: int, world: int, bucket_bytes: int) -> Optional[int]:
        """Join a transfer group of `world` members as member `rank` and send this rank's piece of every tensor
        (`weight_shards`); the bytes this rank sent. None (joining nothing) where the engine cannot send pieces."""
        from verl.workers.weight_transfer import join_transfer_group, send_weight_shards

        shards = self.engines[name].weight_shards()
        if shards is None:
            return None
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        group = join_transfer_group(host, port, self.rank, world, backend, timeout_s=300)
        stats = send_weight_shards(
            group, shards, senders=self.world_size, version=1, device=self.device, bucket_bytes=bucket_bytes
        )
        return stats.bytes

    @register(Dispatch.ONE_TO_ALL)
    def sync_stats(self, name: str) -> Dict[str, int]:
        stats = self.engines[name].last_sync
        return {"received_bytes": stats.received_bytes, "tensors": stats.tensors}
