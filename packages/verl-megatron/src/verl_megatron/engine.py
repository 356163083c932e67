"""The megatron-core train engine: a Hugging Face Llama/Qwen model as megatron GPT chunks over TP x PP (x VPP) x CP x DP,
with sequence parallelism inside TP (on by default when tp > 1).

One instance per worker process, with torch.distributed initialised over the role's ranks. Forward and backward
run through megatron's pipeline schedules (`get_forward_backward_func`) in micro-batches; gradients go through
megatron's DDP and the distributed optimizer. Log-probs and entropy come from the last stage's hidden states and
this rank's vocab-parallel shard of the output weight (two small all-reduces; no full-vocabulary logits).
Weights enter from HF safetensors and leave as HF tensors (streamed one at a time) or an HF folder.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from verl import engine_skeleton as parts
from verl.engine_protocol import EngineConfig, LossFn, Metrics, Shard, TrainEngine
from verl.protocol import DataProto
from verl.utils.offload import Away, empty_device_cache, optimizer_state_tensors
from verl.utils.shared_prefix import attention_weight_of, pack_shared_prefixes, take_positions
from verl_megatron import cpu_compat, memory_model, moe_metrics, torch_adam_fix
from verl_megatron.context_parallel import sum_over_group
from verl_megatron.convert import PipelineSplit, SafetensorsFolder, dims_of, plan
from verl_megatron.parallel import init_model_parallel, sequence_parallel
from verl_megatron.routing_replay import ROUTES, Replay
from verl_megatron.sequences import Rows, hf_positions, packed_rows, pad_rows, padded_rows, rows_kind, thd_rows
from verl_megatron.sequences import rank_inputs, zero_past
from verl_megatron.weights import SyncStats, generation_groups, hf_shapes, load_hf, stream_hf, stream_shards, unwrap

logger = logging.getLogger(__name__)


class MegatronEngine:
    """verl.engine_protocol.TrainEngine on megatron-core: this rank's chunks of the role's model, its optimizer shard."""

    # no in-place generation: the chunks are not one Hugging Face module
    gathered: Optional[Callable[[], ContextManager[torch.nn.Module]]] = None

    @property
    def model(self) -> Sequence[torch.nn.Module]:
        """The model as this engine trains it: its megatron chunks (one per virtual pipeline stage)."""
        return self.chunks

    def __init__(self, cfg: EngineConfig, *, weights_from: str = "hf"):
        """weights_from: "hf" loads model_path's safetensors; "checkpoint" leaves them to load_checkpoint."""
        if not dist.is_initialized():
            raise RuntimeError("MegatronEngine needs torch.distributed initialised (the worker's init_distributed)")
        if weights_from not in ("hf", "checkpoint"):
            raise ValueError(f"weights_from must be 'hf' or 'checkpoint', got {weights_from!r}")
        if cfg.device == "cpu":
            cpu_compat.apply(force=True)
        from verl_megatron.model import build_chunks, transformer_config, transformer_engine_available

        self.cfg = cfg
        self.device = cfg.torch_device()
        self.dtype = cfg.compute_dtype()
        self.hf_config = cfg.hf_config()
        self.layout = layout = init_model_parallel(cfg.parallel, cfg.seed)
        self.sequence_parallel = sequence_parallel(cfg.parallel, layout.tp)
        # Sequence parallelism splits a sequence over tp ranks, context parallelism into 2*cp chunks.
        self.seq_multiple = (layout.tp if self.sequence_parallel else 1) * (2 * layout.cp if layout.cp > 1 else 1)
        self.te = transformer_engine_available(cfg.device)
        # Packing: TransformerEngine's attention takes no mask but the THD layout (every row's real tokens in one
        # stream); megatron's local attention takes the shared-prefix pack's mask (each prompt once).
        self.thd = self.te and layout.cp == 1
        if cfg.shared_prefix and self.te and not self.thd:
            logger.warning(
                "model.shared_prefix: under context parallelism TransformerEngine's packed (THD) layout is not "
                "built here, so this engine computes padded rows"
            )
        self.config = transformer_config(
            self.hf_config,
            layout,
            dtype=self.dtype,
            device=cfg.device,
            sequence_parallel=self.sequence_parallel,
            gradient_checkpointing=cfg.gradient_checkpointing,
            moe_aux_loss_coeff=cfg.moe_aux_loss_coeff,
            # Kept for training even though every weight is then loaded: megatron marks tensor-parallel parameters
            # while initialising them, and without the marks the gradient norm counts TP shards as duplicates.
            # Export (weights_from="checkpoint", TP=1, no optimizer) skips it.
            overrides={"perform_initialization": weights_from == "hf"},
        )
        chunks = build_chunks(self.hf_config, self.config, layout, kind=cfg.kind, te=self.te, seed=cfg.seed)
        self.router_load = moe_metrics.attach(chunks, self.config)  # (a mixture of experts': tokens per expert)
        self.dims = dims_of(self.hf_config, layout.tp)
        split = PipelineSplit(self.hf_config.num_hidden_layers, layout.pp, layout.chunks)
        self.placements = plan(self.hf_config, split, kind=cfg.kind, te=self.te, ep=layout.ep)
        self.fresh: List[str] = []  # HF tensors not in model_path (a critic's new value head)
        if weights_from == "hf":
            folder = SafetensorsFolder(cfg.model_path)
            optional = ("score.weight", "score.bias") if cfg.kind == "value" else ()
            self.fresh = load_hf(chunks, self.placements, folder.get, layout, self.dims, optional=optional)
        self._gen_groups: Dict[int, Any] = {}
        self.last_sync = SyncStats()
        self._tokens = [0, 0, 0]  # this step's tokens: real, in the padded layout, computed (packed rows' count)
        self._routes: Optional[Replay] = None
        self.optimizer = None
        self.state = parts.TrainState()
        if cfg.optim is not None:
            torch_adam_fix.apply()
            chunks = self._wrap_ddp(chunks)  # type: ignore[arg-type,assignment]  # (GPT chunks are modules)
            self.optimizer = self._build_optimizer(chunks)  # type: ignore[arg-type]
        self.chunks = chunks
        # Host memory between phases (verl.utils.offload): parameters are views of DDP's contiguous buffer, which
        # stays valid; the gradient buffer is zeroed before every step, so its content is not kept.
        self.params_away = Away(self._parameters, enabled=cfg.param_offload)
        self.grads_away = Away(
            lambda: [getattr(p, "main_grad", None) for p in self._parameters()], enabled=cfg.param_offload, keep=False
        )
        # The optimizer's fp32 groups (bf16 runs: main copies of this rank's shard; fp32: views of the parameters,
        # which stay) and its moments.
        self.optim_away = Away(
            self._optimizer_tensors, enabled=cfg.optimizer_offload and self.optimizer is not None, skip=self._parameters
        )

    def _parameters(self) -> List[torch.Tensor]:
        return [p for c in self.chunks for p in c.parameters()]

    def _optimizer_tensors(self) -> List[torch.Tensor]:
        inner = [o.optimizer for o in getattr(self.optimizer, "chained_optimizers", [self.optimizer])]
        groups = [p for o in inner for g in o.param_groups for p in g["params"]]
        return groups + [t for o in inner for t in optimizer_state_tensors(o)]

    def _resident(self, grads: bool = False) -> None:
        """Parameters back on the device before any call that uses them; the gradient buffers for a step."""
        self.params_away.resident()
        if grads:
            self.grads_away.resident()

    def held_bytes(self) -> Dict[str, int]:
        """This rank's state counted from its tensors' storages (verl_megatron.memory_model estimates the same)."""
        params = self._parameters()
        grads = [getattr(p, "main_grad", None) for p in params]
        return memory_model.held_bytes(params, grads, self._optimizer_tensors() if self.optimizer else [])

    def release_memory(self) -> None:
        """verl.engine_protocol.TrainEngine.release_memory."""
        self.params_away.release()
        self.grads_away.release()
        empty_device_cache()

    # ---- setup -----------------------------------------------------------------------------------------
    def _wrap_ddp(self, chunks: List[torch.nn.Module]) -> List[torch.nn.Module]:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.distributed import finalize_model_grads

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True
        )
        wrapped = [
            DistributedDataParallel(self.config, ddp_config, chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)
        ]
        # The pipeline schedules sync gradients once, after the last micro-batch (what FSDP's
        # set_requires_gradient_sync does), then finalize (DP reduce-scatter, tied-embedding all-reduce).
        self.config.no_sync_func = [w.no_sync for w in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
        self.config.finalize_model_grads_func = finalize_model_grads
        return wrapped

    def _build_optimizer(self, chunks: List[torch.nn.Module]):
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        o = self.cfg.optim
        betas = tuple(o.betas)
        config = OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            weight_decay=o.weight_decay,
            adam_beta1=betas[0],
            adam_beta2=betas[1],
            adam_eps=o.eps,
            clip_grad=o.grad_clip,
            use_distributed_optimizer=True,
            params_dtype=self.dtype,
            bf16=self.dtype == torch.bfloat16,
            fp16=False,
        )
        return get_megatron_optimizer(config, chunks)

    def data_parallel_info(self) -> Tuple[int, int, bool]:
        return self.layout.dp_rank, self.layout.dp, self.layout.collect

    # ---- forward ---------------------------------------------------------------------------------------
    def _micro_batches(
        self, batch: DataProto, micro_batch_size: int, max_tokens: Optional[int] = None
    ) -> List[DataProto]:
        """Micro-batches of `micro_batch_size` rows, or of at most `max_tokens` tokens with tokens balanced over
        them (every one runs at the largest's shape under pipeline stages); the interleaved schedule (vpp) runs
        them in groups of pp, so their number is made a multiple of pp."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        pp = self.layout.pp
        if max_tokens is not None:
            return parts.micro_batches(batch, micro_batch_size, max_tokens, multiple=pp if self.layout.vpp else 1)
        micro = batch.split(micro_batch_size)
        if self.layout.vpp and len(micro) % pp:
            # pieces as even as the rows allow, none larger than asked
            count = -(-len(micro) // pp) * pp
            if count > len(batch):
                raise ValueError(
                    f"{len(batch)} rows cannot make a multiple of pp={pp} micro-batches, which the interleaved "
                    "pipeline schedule (parallel.vpp) needs; use more rows or parallel.vpp=null"
                )
            micro = batch.chunk(count)
        return micro

    def _outputs(
        self,
        model: torch.nn.Module,
        hidden: torch.Tensor,
        mb: Dict[str, Any],
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
    ) -> Dict[str, torch.Tensor]:
        """Per-token outputs aligned with `responses` from the last stage's hidden states [b, s, h]."""
        if self.layout.cp == 1:
            h = take_positions(hidden, mb["hidden_row"], mb["predict_index"])  # [B, R, h]
            return zero_past(self._head(model, h, mb["labels"], temperature, entropy, entropy_grad), mb)
        from megatron.core import parallel_state as mpu

        # This rank predicts the response tokens whose predicting position it holds; the group sums the pieces.
        where = mb["local_index"]
        rows, cols = (where >= 0).nonzero(as_tuple=True)
        h = take_positions(hidden, mb["hidden_row"][rows, cols], where[rows, cols])[None]
        local = self._head(model, h, mb["labels"][rows, cols][None], temperature, entropy, entropy_grad)
        group = mpu.get_context_parallel_group()
        full = {}
        for key, value in local.items():
            placed = value.new_zeros(where.shape).index_put((rows, cols), value[0])
            full[key] = sum_over_group(placed, group)
        return zero_past(full, mb)

    def _head(
        self,
        model: torch.nn.Module,
        h: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
    ) -> Dict[str, torch.Tensor]:
        """Values, or log-probs (and entropy) of `labels`, from hidden states h [b, r, h]."""
        from megatron.core import parallel_state as mpu

        from verl_kernels import vocab_parallel_linear_logprob_entropy

        gpt = unwrap(model)
        if gpt.value_head is not None:
            return {"values": gpt.value_head(h).squeeze(-1).float()}
        if h.shape[1] == 0:  # (a context-parallel rank holding none of the predicting positions)
            empty = h.sum(-1).float()  # still part of the graph: backward must reach this rank's collectives
            return {"log_probs": empty, **({"entropy": empty} if entropy else {})}
        weight = gpt.output_weight()
        rows = weight.shape[0]
        vocab_start = self.layout.tp_rank * rows
        real = max(0, min(rows, self.dims.vocab_size - vocab_start))  # padded rows are not part of the vocabulary
        log_probs, ent = vocab_parallel_linear_logprob_entropy(
            h,
            weight[:real],
            labels,
            vocab_start=vocab_start,
            group=mpu.get_tensor_model_parallel_group(),
            temperature=temperature,
            entropy_grad=entropy_grad and entropy,
            impl=self.cfg.fused_kernel_impl if self.cfg.use_fused_kernels else "chunked",
        )
        out = {"log_probs": log_probs.float()}
        if entropy:
            out["entropy"] = ent.float()
        return out

    def _rows(self, mb: DataProto, pack: bool = True) -> Rows:
        """One micro-batch's rows: packed by shared prompt (model.shared_prefix, local attention: the mask is an
        input) where that pays and `pack` allows, else padded."""
        b = mb.batch
        positions = b["position_ids"] if "position_ids" in b.keys() else hf_positions(b["attention_mask"])
        if pack and self.cfg.shared_prefix and self.thd:
            return thd_rows(b["input_ids"], b["attention_mask"], positions, b["responses"], self.seq_multiple)
        if pack and self.cfg.shared_prefix and not self.te:
            r = b["responses"].shape[1]
            weight = attention_weight_of(self.hf_config)
            prefix_pack = pack_shared_prefixes(b["input_ids"], b["attention_mask"], positions, r, weight)
            if prefix_pack is not None:
                return packed_rows(prefix_pack, b["responses"])
        return padded_rows(b["input_ids"], b["attention_mask"], b["responses"], self.seq_multiple)

    def _layouts(self, micro: List[DataProto]) -> List[Rows]:
        """Each micro-batch's rows, shaped as the schedule needs: with pipeline stages every micro-batch has one
        shape (all grown to the largest; padded rows for all when any does not pack), and lengths are multiples of
        what sequence and context parallelism split."""
        rows = [self._rows(mb) for mb in micro]
        self._tokens[0] += sum(int(mb.batch["attention_mask"].sum()) for mb in micro)
        self._tokens[1] += sum(mb.batch["input_ids"].numel() for mb in micro)
        if self.layout.pp > 1 and len({rows_kind(r) for r in rows}) > 1:  # one kind for the schedule: padded
            rows = [self._rows(mb, pack=False) for mb in micro]

        def fit(length: int) -> int:  # (padded rows are sized so by `pack` already)
            return -(-length // self.seq_multiple) * self.seq_multiple

        if self.layout.pp > 1:  # one shape for every micro-batch (the schedule sends one)
            common = max(r.input_ids.shape[0] for r in rows), fit(max(r.input_ids.shape[1] for r in rows))
            rows = [pad_rows(r, *common) for r in rows]
        else:
            rows = [r if r.mask is None else pad_rows(r, r.input_ids.shape[0], fit(r.input_ids.shape[1])) for r in rows]
        self._tokens[2] += sum(r.input_ids.numel() for r in rows)
        return rows

    def _run(
        self,
        micro: List[DataProto],
        *,
        forward_only: bool,
        on_outputs: Callable[[Dict[str, torch.Tensor], DataProto, int], Optional[torch.Tensor]],
        temperature: float = 1.0,
        entropy: bool = False,
        entropy_grad: bool = True,
        replay: Optional[Replay] = None,
    ) -> None:
        """Run every micro-batch through megatron's schedule; the last stage calls on_outputs(outputs, mb, i),
        whose returned loss (None: no backward) is what the schedule differentiates. `replay`: padded rows, each
        micro-batch routed to its `routed_experts` column, or their routes recorded (`Replay.record()`)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        layouts = self._layouts(micro)
        packed = [rank_inputs(rows, self.layout, self.device) for rows in layouts]
        n = len(micro)
        if replay is not None:
            replay.begin(micro, layouts)

        def forward_step(data_iterator, model):
            i, mb = next(data_iterator)
            if replay is not None:
                replay.before(model, i)
            out = model(
                mb["input_ids"],
                mb["position_ids"],
                mb["attention_mask"],
                packed_seq_params=mb.get("packed_seq_params"),
            )
            if replay is not None:
                replay.after(model, i)

            def loss_func(hidden: torch.Tensor):
                grad = entropy_grad and not forward_only
                outputs = self._outputs(model, hidden, mb, temperature, entropy, entropy_grad=grad)
                loss = on_outputs(outputs, micro[i], i)
                if loss is None:
                    return torch.zeros((), device=hidden.device), {}
                # The schedule divides by the number of micro-batches; on_outputs already weighted the loss.
                return loss * n, {}

            return out, loss_func

        iterators = [iter(list(enumerate(packed))) for _ in self.chunks]
        seq = packed[0]["input_ids"].shape[1] * self.layout.cp  # the schedule divides by cp (and by tp under SP)
        try:
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iterators if len(iterators) > 1 else iterators[0],
                model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
                num_microbatches=n,
                seq_length=seq,
                micro_batch_size=packed[0]["input_ids"].shape[0],
                forward_only=forward_only,
            )
        finally:
            if replay is not None:  # (recording or replaying: the routers choose for themselves again)
                replay.off()

    def _from_last_stage(self, obj: Any) -> Any:
        """An object computed on the last pipeline stage, on every stage (small: metrics, per-token outputs)."""
        if self.layout.pp == 1:
            return obj
        from megatron.core import parallel_state as mpu

        group = mpu.get_pipeline_model_parallel_group()
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, self.layout.pp - 1), group=group)
        return box[0]

    def infer(
        self,
        batch: DataProto,
        *,
        micro_batch_size: int,
        temperature: float = 1.0,
        entropy: bool = False,
        max_tokens: Optional[int] = None,
        routes: bool = False,
        replay: bool = False,
    ) -> DataProto:
        """verl.engine_protocol.TrainEngine.infer; `max_tokens` cuts micro-batches by tokens instead of rows;
        `routes`: a mixture of experts also returns the experts every token went to; `replay`: it routes every
        token to the batch's `routed_experts` instead (`routing_replay`)."""
        self._resident()
        for c in self.chunks:
            c.eval()
        outs: List[Dict[str, torch.Tensor]] = []
        if routes and replay:
            raise ValueError("a pass records its routes or replays given ones, not both")
        router_replay = self._replay().record() if routes else self._replay() if replay else None

        def keep(outputs: Dict[str, torch.Tensor], mb: DataProto, i: int) -> None:
            outs.append({k: v.detach().cpu() for k, v in outputs.items()})
            return None

        with torch.no_grad():
            self._run(
                self._micro_batches(batch, micro_batch_size, max_tokens),
                forward_only=True,
                temperature=temperature,
                entropy=entropy,
                on_outputs=keep,
                replay=router_replay,
            )
        merged = self._from_last_stage({k: torch.cat([o[k] for o in outs]) for k in outs[0]} if outs else None)
        if routes:  # (every stage and tensor/context rank recorded a part: put together on all)
            merged[ROUTES] = torch.cat(router_replay.collected())
        return DataProto.from_dict(merged)

    # ---- training --------------------------------------------------------------------------------------
    def train_step(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        micro_batch_size: int,
        max_tokens: Optional[int] = None,
        **forward: Any,
    ) -> Metrics:
        """verl.engine_protocol.TrainEngine.train_step (as the FSDP engine's) through megatron's pipeline schedule."""
        parts.require_optimizer(self.optimizer)
        self._resident(grads=True)
        for c in self.chunks:
            c.train()
            c.zero_grad_buffer()
        self.optimizer.zero_grad()
        from megatron.core import parallel_state as mpu

        # Tokens are counted over the data-parallel replicas (TP/PP/CP peers hold the same rows).
        acc = parts.Accumulator.for_batch(batch, loss_fn, group=mpu.get_data_parallel_group())
        self._tokens = [0, 0, 0]
        micro = self._micro_batches(batch, micro_batch_size, max_tokens)
        replay = self._replay() if ROUTES in batch.batch.keys() else None
        self._run(
            micro, forward_only=False, on_outputs=lambda outputs, mb, i: acc(outputs, mb), replay=replay, **forward
        )
        with self.optim_away.back():  # (optimizer_offload: in host memory except while it steps, saves or loads)
            step = parts.optimizer_step(
                self.state, self.optimizer, self.cfg, grad_norm=self._grad_norm, update=self._update
            )
        layout = parts.layout_metrics(len(micro), *self._tokens)
        moe = self.router_load.take(self.device, len(micro), replay is not None) if self.router_load is not None else {}
        if replay is not None:  # (how many given experts the router would have chosen itself)
            moe.update(replay.agreement())
        return {**self._from_last_stage(acc.totals), **step, **layout, **moe}

    def _replay(self) -> Replay:
        """Routing replay over this engine's routers (built on first use; refused for a dense model)."""
        recompute = self.config.recompute_granularity == "full"
        self._routes = self._routes or Replay(self.chunks, self.layout, recompute=recompute)
        return self._routes

    def _grad_norm(self) -> float:
        """Megatron's step up to the norm: gradients to the main params, the global norm over TP/PP/DP."""
        self.optimizer.prepare_grads()
        return float(self.optimizer.get_grad_norm())

    def _update(self, grad_norm: float) -> None:
        """The rest of megatron's step (clip, update, param all-gather), taken only for a finite norm."""
        from megatron.core.optimizer import clip_grads

        opt = self.optimizer
        for inner in getattr(opt, "chained_optimizers", [opt]):
            params = inner.get_parameters()
            if params and inner.config.clip_grad > 0.0:
                clip_grads.clip_grad_by_total_norm_fp32(params, max_norm=inner.config.clip_grad, total_norm=grad_norm)
        opt.step_with_ready_grads()

    # ---- weights -----------------------------------------------------------------------------------------
    @functools.cached_property
    def _hf_shapes(self) -> Dict[str, torch.Size]:
        return hf_shapes(self.hf_config, self.cfg.kind)

    def weights(self, gen_tp: int = 1) -> Iterator[Tuple[str, torch.Tensor]]:
        """Full parameters (gen_tp=1), or this rank's shard for a generation engine with tensor parallelism
        gen_tp, one HF tensor at a time; collective: every rank of the role must consume the iterator fully.

        The shipped rollout engines take full tensors (vLLM and SGLang slice their own TP shard while loading);
        gen_tp > 1 serves an engine that takes pre-sharded tensors (HybridFlow's micro-DP gather)."""
        self._resident()
        if gen_tp not in self._gen_groups:
            self._gen_groups[gen_tp] = generation_groups(self.layout, gen_tp)
        self.last_sync = SyncStats()
        return stream_hf(
            self.chunks,
            self.placements,
            self.layout,
            self.dims,
            self._hf_shapes,
            dtype=self.dtype,
            gen=self._gen_groups[gen_tp],
            stats=self.last_sync,
        )

    def weight_shards(self) -> Optional[Iterator[Shard]]:
        """This rank's TP piece of each HF tensor of its stage (`weights.stream_shards`); None: MoE, value models."""
        if self.cfg.kind != "causal_lm" or any(p.expert is not None for p in self.placements):
            return None
        self.last_sync = SyncStats()  # nothing is gathered
        args = (self.chunks, self.placements, self.layout, self.dims, self._hf_shapes)
        return stream_shards(*args, dtype=self.dtype, before=self._resident)  # (lazy: a probe for None moves nothing)

    def lora_adapter(self) -> None:
        return None  # no LoRA on this engine (validate refuses actor.lora on megatron)

    def sync_received_bytes(self) -> int:
        return self.last_sync.received_bytes

    # ---- checkpoints --------------------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        from verl_megatron.engine_checkpoint import save_engine

        save_engine(self, path)

    def load_checkpoint(self, path: str, *, model_only: bool = False) -> None:
        """Restore a checkpoint of this engine (saved at any TP/PP); model_only: weights alone (export)."""
        from verl_megatron.engine_checkpoint import load_engine

        load_engine(self, path, model_only=model_only)

    def export_hf(self, path: str) -> None:
        """Rank 0 writes safetensors + config + tokenizer (and generation config) to `path`; collective."""
        from verl_megatron.engine_checkpoint import export_engine

        export_engine(self, path)


def _conforms(engine: MegatronEngine) -> TrainEngine:  # (the type checker holds the engine to its protocol)
    return engine
