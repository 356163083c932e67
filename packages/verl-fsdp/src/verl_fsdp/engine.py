"""The FSDP2 train engine: a Hugging Face causal LM (or value model) sharded over this role's ranks.

One instance per worker process; torch.distributed must be initialised (world size 1 included). At world size 1
with nothing for FSDP to do (fp32 compute, no offload) the model stays a plain module: no shards, no hooks, the
same results ~1.2x faster on CPU; checkpoints are the same DCP layout either way. The engine knows nothing of
RL: it computes per-token outputs (on packed rows, verl.utils.shared_prefix, where that pays), runs a caller's
loss over micro-batches, steps the optimizer, and moves weights and checkpoints in and out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

from verl import engine_skeleton as parts
from verl.engine_protocol import EngineConfig, LossFn, Metrics, TrainEngine
from verl.engine_protocol import Shard as WeightShard
from verl.protocol import DataProto
from verl.utils.hf_files import checkpoint_tensors, copy_tokenizer_files
from verl.utils.logprob import entropy_from_logits, logprobs_from_logits
from verl.utils.offload import Away, empty_device_cache, optimizer_state_tensors
from verl.utils.padding_free import padding_free
from verl.utils.shared_prefix import MASKABLE_ATTENTION, PrefixPack, attention_weight_of, pack_shared_prefixes
from verl_fsdp import dtensor_optim, sequence_parallel
from verl_fsdp.lora import adapter_state, apply_lora, is_lora, merged_weights
from verl_fsdp.model import build_model
from verl_fsdp.parallelize import apply_fsdp, apply_tp, split_world
from verl_fsdp.vision import image_keys, image_rows, vision_inputs, vision_tower

LORA_ADAPTER_DIR = "lora_adapter"  # where export_hf writes a LoRA run's peft adapter folder


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _local_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Bytes of this rank's part of each tensor (a DTensor's local shard)."""
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None]
    return sum(t.numel() * t.element_size() for t in local)


class FSDPEngine:
    def __init__(self, cfg: EngineConfig):
        if not dist.is_initialized():
            raise RuntimeError("FSDPEngine needs torch.distributed initialised (the worker's init_distributed)")
        self.cfg = cfg
        self._shard_names: Optional[Dict[str, str]] = None  # parameter -> checkpoint name (weight_shards)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = cfg.torch_device()
        self.dtype = cfg.compute_dtype()
        self.tp, self.cp, self.dp = split_world(cfg.parallel, self.world_size)
        # ranks as the placement plan numbers them: tp fastest, then cp, then dp
        mesh = init_device_mesh(self.device.type, (self.dp, self.cp, self.tp), mesh_dim_names=("dp", "cp", "tp"))
        self.dp_rank, self.cp_rank, self.tp_rank = (mesh.get_local_rank(d) for d in ("dp", "cp", "tp"))
        self.dp_group = mesh.get_group("dp")
        self.tp_mesh = mesh["tp"]
        self.cp_group = mesh.get_group("cp") if self.cp > 1 else None
        # FSDP shards over every rank that is not a tensor-parallel peer: the sequence-parallel ones hold the same
        # parameters and differ only in the positions they compute.
        self.mesh = mesh["dp", "cp"]._flatten("dp_cp") if self.cp > 1 else mesh["dp"]

        torch.manual_seed(cfg.seed)  # the same fresh value head on every rank
        model = build_model(cfg, torch.float32)  # master weights in fp32; mixed precision casts for compute
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if cfg.param_offload:  # weights read straight from safetensors may sit in storage that cannot be emptied
            for p in model.parameters():
                if not p.untyped_storage().resizable():
                    p.data = p.data.clone()
        if cfg.lora is not None:  # before sharding: FSDP shards the adapters with their layers
            if self.tp > 1:
                raise ValueError("LoRA on the fsdp engine is data parallel: set the role's parallel.tp=1")
            model = apply_lora(model, cfg.lora, cfg.kind)
        if cfg.freeze_vision_tower:  # before sharding and the optimizer: no gradients, no optimizer state
            vision_tower(model).requires_grad_(False)
        # replicated parameters whose gradients only this rank's heads make (summed over tp after backward)
        partial = set(apply_tp(model, self.tp_mesh)) if self.tp > 1 else set()
        if self.cp > 1:
            sequence_parallel.check_shapes(model.config, self.cp, cfg.attn_implementation)
        # FSDP earns its hooks by sharding or mixed precision; with neither it only adds overhead.
        self.sharded = self.mesh.size() > 1 or self.dtype != torch.float32
        if self.sharded:
            apply_fsdp(model, self.mesh, device=cfg.device, dtype=self.dtype)
        if cfg.device != "cpu":
            model.to(self.device)
        self.model = model
        self._tp_partial = [p for name, p in model.named_parameters() if name in partial]  # (FSDP's, after sharding)
        self.optimizer = None
        self.state = parts.TrainState()
        self._tokens = [0, 0, 0]  # this step's tokens: real, in the padded layout, computed (packing's count)
        self._grad_bytes = 0  # this rank's gradients at the last optimizer step (freed right after it)
        if cfg.optim is not None:
            # LoRA: the frozen base has no gradients and no optimizer state
            self.optimizer = dtensor_optim.adamw([p for p in model.parameters() if p.requires_grad], cfg.optim)
        # A colocated hf rollout generates on this module in place, each rank on its own rows; tensor-parallel
        # layers need every tp peer in each forward, so the rollout keeps its own copy instead.
        self.gathered = self._gathered if self.tp == 1 else None
        # Host memory between phases (verl.utils.offload); FSDP's shards are views of its sharded data, kept valid.
        self.params_away = Away(self.model.parameters, enabled=cfg.param_offload)
        self.optim_away = Away(
            lambda: optimizer_state_tensors(self.optimizer), enabled=cfg.optimizer_offload and cfg.optim is not None
        )

    def release_memory(self) -> None:
        """verl.engine_protocol.TrainEngine.release_memory (gradients are already freed after every step)."""
        if self.sharded:  # the root stays unsharded after a forward without backward (a log-prob pass)
            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()
        self.params_away.release()
        empty_device_cache()

    def data_parallel_info(self) -> Tuple[int, int, bool]:
        """tp and cp peers take the same rows; the first of them returns the results."""
        return self.dp_rank, self.dp, self.tp_rank == 0 and self.cp_rank == 0

    # ---- forward -------------------------------------------------------------------------------------
    def _forward(
        self, mb: DataProto, temperature: float = 1.0, entropy: bool = False, entropy_grad: bool = True
    ) -> Dict[str, torch.Tensor]:
        b = mb.batch
        r = b["responses"].shape[1]
        labels = b["responses"].to(self.device)
        images = image_rows(mb)
        pack = self._pack(b, r, image_keys(images) if images is not None else None)
        vision = vision_inputs(self.model, mb, images, self.device, pack) if images is not None else None
        padded = b["input_ids"].numel()
        self._tokens[0] += int(b["attention_mask"].sum())
        self._tokens[1] += padded
        self._tokens[2] += pack.tokens if pack is not None else padded
        impl = self.model.config._attn_implementation
        if self.cp > 1 and vision is not None:
            raise ValueError("image prompts on the fsdp engine run without context parallelism: set parallel.cp=1")
        if self.cp > 1:  # this rank's chunk of every row's positions (verl_fsdp.sequence_parallel)
            ids, pos = (pack.input_ids, pack.position_ids) if pack is not None else (b["input_ids"], b["position_ids"])
            allowed = pack.allowed if pack is not None else sequence_parallel.padded_rows_allowed(b["attention_mask"])
            assert allowed is not None  # (a padding-free pack takes no mask: refused with cp at construction)
            inputs, shards = sequence_parallel.shard(
                ids.to(self.device), pos.to(self.device), allowed.to(self.device), self.cp_group, impl, self.dtype
            )
            with shards.attending(self.model):
                return self._outputs(
                    {**inputs, "use_cache": False}, pack, labels, r, temperature, entropy, entropy_grad, shards
                )
        if pack is not None:
            kwargs = dict(
                input_ids=pack.input_ids,
                attention_mask=pack.attention_mask(impl, self.dtype),
                position_ids=pack.position_ids,
                use_cache=False,
            )
        else:
            kwargs = dict(
                input_ids=b["input_ids"].to(self.device),
                attention_mask=b["attention_mask"].to(self.device),
                position_ids=b["position_ids"].to(self.device),
                use_cache=False,
            )
        kwargs.update(vision or {})  # (their multimodal positions in place of the 1-D ones)
        return self._outputs(kwargs, pack, labels, r, temperature, entropy, entropy_grad)

    def _outputs(
        self,
        kwargs: Dict[str, Any],
        pack: Optional[PrefixPack],
        labels: torch.Tensor,
        r: int,
        temperature: float,
        entropy: bool,
        entropy_grad: bool,
        shards: Optional[sequence_parallel.SequenceShards] = None,
    ) -> Dict[str, torch.Tensor]:
        """The model on `kwargs`, read out at the positions that predict the response tokens (and their values);
        with `shards`, this rank's positions, gathered from every cp rank before the read-out."""
        whole = shards.gather if shards is not None else (lambda x: x)
        if self.cfg.kind == "value":
            values = whole(self.model(**kwargs).logits).squeeze(-1).float()
            # The value of the state before each response token: positions P-1 .. P+R-2.
            return {"values": pack.gather(values) if pack is not None else values[:, -r - 1 : -1]}
        if pack is None and shards is None and not self.cfg.use_fused_kernels:
            # Only the last R+1 positions' logits are computed: the ones that predict response tokens.
            logits = self.model(**kwargs, logits_to_keep=r + 1).logits[:, :-1]
            return self._token_outputs(logits, labels, temperature, entropy)
        hidden, head = self._hidden(kwargs, keep=0 if pack is not None or shards is not None else r + 1)
        hidden = whole(hidden)
        hidden = pack.gather(hidden) if pack is not None else hidden[:, -r - 1 : -1]
        if self.cfg.use_fused_kernels:
            from verl_kernels import linear_logprob_entropy

            log_probs, ent = linear_logprob_entropy(
                hidden,
                cast(torch.Tensor, head.weight),
                labels,
                temperature=temperature,
                impl=self.cfg.fused_kernel_impl,
                entropy_grad=entropy_grad,
            )
            return {"log_probs": log_probs, "entropy": ent}
        return self._token_outputs(head(hidden), labels, temperature, entropy)

    def _pack(self, b: Any, r: int, prompt_keys: Optional[List[bytes]] = None) -> Optional[PrefixPack]:
        """The micro-batch packed (model.shared_prefix): by shared prompt (verl.utils.shared_prefix; `prompt_keys`:
        what else a prompt holds, its images) where the attention takes a 4D mask (sdpa, eager), else padding-free
        (verl.utils.padding_free: flash-attention's varlen path); None: padded rows (packing off, or a shared-prefix
        pack would not pay)."""
        if not self.cfg.shared_prefix:
            return None
        if self.model.config._attn_implementation not in MASKABLE_ATTENTION:
            return padding_free(b["input_ids"], b["attention_mask"], b["position_ids"], r)
        weight = attention_weight_of(self.model.config)
        return pack_shared_prefixes(b["input_ids"], b["attention_mask"], b["position_ids"], r, weight, prompt_keys)

    @staticmethod
    def _token_outputs(
        logits: torch.Tensor, labels: torch.Tensor, temperature: float, entropy: bool
    ) -> Dict[str, torch.Tensor]:
        logits = logits.float() / temperature
        out = {"log_probs": logprobs_from_logits(logits, labels)}
        if entropy:
            out["entropy"] = entropy_from_logits(logits)
        return out

    def _hidden(self, kwargs: Dict[str, Any], keep: int) -> Tuple[torch.Tensor, torch.nn.Module]:
        """The final hidden states (of the last `keep` positions; 0: all) and the output head, which is bypassed
        inside the root forward, so FSDP still gathers its weight, and applied by the caller (its gradient flows
        back through whatever the caller does with it: a gather, the fused kernels)."""
        head = self.model.get_output_embeddings()
        # the head's parent: the model itself, or the Hugging Face model inside peft's wrappers
        parent, name = next((m, n) for m in self.model.modules() for n, c in m.named_children() if c is head)
        setattr(parent, name, torch.nn.Identity())
        try:
            hidden = self.model(**kwargs, logits_to_keep=keep).logits
        finally:
            setattr(parent, name, head)
        return hidden, head

    def infer(
        self,
        batch: DataProto,
        *,
        micro_batch_size: int,
        temperature: float = 1.0,
        entropy: bool = False,
        max_tokens: Optional[int] = None,
    ) -> DataProto:
        """verl.engine_protocol.TrainEngine.infer; `max_tokens` cuts micro-batches by tokens instead of rows."""
        self.params_away.resident()
        self.model.eval()
        outs: List[Dict[str, torch.Tensor]] = []
        with torch.no_grad():
            for mb in parts.micro_batches(batch, micro_batch_size, max_tokens):
                outs.append({k: v.cpu() for k, v in self._forward(mb, temperature, entropy).items()})
        return DataProto.from_dict({k: torch.cat([o[k] for o in outs]) for k in outs[0]})

    # ---- training ------------------------------------------------------------------------------------
    def train_step(
        self,
        batch: DataProto,
        loss_fn: LossFn,
        *,
        micro_batch_size: int,
        max_tokens: Optional[int] = None,
        **forward: Any,
    ) -> Metrics:
        """verl.engine_protocol.TrainEngine.train_step; `max_tokens` cuts micro-batches by tokens instead of rows (the
        Accumulator's weights keep the step the whole batch's); `forward` (temperature, entropy, entropy_grad)
        goes to the forward."""
        parts.require_optimizer(self.optimizer)
        self.params_away.resident()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        micro = parts.micro_batches(batch, micro_batch_size, max_tokens)
        acc = parts.Accumulator.for_batch(batch, loss_fn, self.dp_group)
        self._tokens = [0, 0, 0]
        for i, mb in enumerate(micro):
            if self.sharded:  # reduce-scatter gradients once, on the last micro-batch, not after every backward
                self.model.set_requires_gradient_sync(i == len(micro) - 1)
            acc(self._forward(mb, **forward), mb).backward()
        for p in self._tp_partial:
            if p.grad is not None:
                grad = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad  # its storage, reduced in place
                dist.all_reduce(grad, group=self.tp_mesh.get_group())
        with self.optim_away.back():
            step = parts.optimizer_step(
                self.state,
                self.optimizer,
                self.cfg,
                grad_norm=self._clip_grad_norm,
                update=lambda _: self._update(),
            )
        self.optimizer.zero_grad(set_to_none=True)
        layout = parts.layout_metrics(len(micro), *self._tokens)
        return {**acc.totals, **step, **layout}

    def _clip_grad_norm(self) -> float:
        params = list(self.model.parameters())
        if len(dtensor_optim.by_mesh(params)) > 1:  # tensor-parallel parameters beside replicated ones
            return dtensor_optim.clip_grad_norm(params, self.cfg.optim.grad_clip)
        return float(_full(torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.grad_clip)))

    def _update(self) -> None:
        self._grad_bytes = _local_bytes(p.grad for p in self.model.parameters())
        self.optimizer.step()

    def held_bytes(self) -> Dict[str, int]:
        """This rank's state counted from its tensors: parameters (local shards), gradients at the last optimizer
        step, optimizer state (verl_fsdp.memory_model estimates the same before launch)."""
        optimizer = _local_bytes(optimizer_state_tensors(self.optimizer)) if self.optimizer is not None else 0
        return {"params": _local_bytes(self.model.parameters()), "grads": self._grad_bytes, "optimizer": optimizer}

    @contextlib.contextmanager
    def _gathered(self) -> Iterator[torch.nn.Module]:
        """Hold every FSDP unit unsharded (full weights, no per-forward all-gathers) for generation, then
        release them: the hybrid engine's generation phase without a second copy of the weights."""
        self.params_away.resident()
        if not self.sharded:
            yield self.model
            return
        units = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
        for m in units:
            m.unshard()
            m.set_reshard_after_forward(False, recurse=False)
        try:
            yield self.model
        finally:
            for m in units:
                m.set_reshard_after_forward(m is not self.model, recurse=False)  # as apply_fsdp set them
                m.reshard()

    @contextlib.contextmanager
    def adapters_off(self) -> Iterator[None]:
        """The base model, LoRA adapters bypassed (the reference policy of a LoRA run: no second copy)."""
        if not is_lora(self.model):
            raise RuntimeError("adapters_off: this engine trains no LoRA adapters (set actor.lora.rank)")
        with self.model.disable_adapter():
            yield

    # ---- weights and checkpoints ---------------------------------------------------------------------
    def weights(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """Full parameters under their checkpoint names (`hf_files.checkpoint_tensors`: a mixture of experts' experts one
        by one); with LoRA, the base with the adapters merged in."""
        self.params_away.resident()
        lora = is_lora(self.model)
        hf_model = self.model.get_base_model() if lora else self.model
        named = merged_weights(self.model, _full) if lora else self.model.named_parameters()
        for name, tensor in named:
            yield from checkpoint_tensors(hf_model, name, _full(tensor.detach()))

    def weight_shards(self) -> Optional[Iterator[WeightShard]]:
        """This rank's dim-0 rows of each parameter under its checkpoint name (FSDP's shards, as torch.chunk cuts
        them): what a rank sends to a rollout pool of its own without gathering anything. None where a parameter's
        checkpoint form is not its own rows (LoRA's merged weights, a mixture of experts' fused experts) or it is
        not sharded on dim 0 alone (tensor parallel)."""
        if is_lora(self.model):
            return None
        if self._shard_names is None:  # read once: {} when some parameter cannot go as its own rows
            names: Dict[str, str] = {}
            for name, p in self.model.named_parameters():
                saved = list(checkpoint_tensors(self.model, name, torch.empty(p.shape, dtype=p.dtype, device="meta")))
                rows = isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),)
                if len(saved) != 1 or saved[0][1].shape != p.shape or not rows:
                    names = {}
                    break
                names[name] = saved[0][0]
            self._shard_names = names
        if not self._shard_names:
            return None
        return self._local_rows()

    def _local_rows(self) -> Iterator[WeightShard]:
        assert self._shard_names is not None
        self.params_away.resident()
        for name, p in self.model.named_parameters():
            yield WeightShard(self._shard_names[name], cast(DTensor, p).to_local().detach(), tuple(p.shape))

    def lora_adapter(self) -> Optional[Tuple[Dict[str, Any], Iterator[Tuple[str, torch.Tensor]]]]:
        """With LoRA: (peft adapter config, the adapter tensors, full, in peft's saved names); else None."""
        self.params_away.resident()
        return adapter_state(self.model, _full) if is_lora(self.model) else None

    def sync_received_bytes(self) -> int:
        return 0  # the FSDP all-gathers in weights() are not counted

    def _sharded_state(self) -> Dict[str, Dict]:
        """This rank's shards of the model (and optimizer) state, as DCP saves and loads them in place."""
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model, options=self._state_options()), "optim": {}}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._state_options())
        return {"model": model_sd, "optim": optim_sd}

    def _state_options(self) -> StateDictOptions:
        # LoRA: a checkpoint holds what trains (adapters, a value head) and its optimizer state; the frozen base
        # is the run's model, loaded again on resume
        return StateDictOptions(ignore_frozen_params=is_lora(self.model), strict=not is_lora(self.model))

    def save_checkpoint(self, path: str) -> None:
        self.params_away.resident()
        with self.optim_away.back():
            dcp.save(self._sharded_state(), checkpoint_id=path)
        parts.save_extra(path, self.state)
        if self.rank == 0:
            with open(parts.meta_file(path, "fsdp"), "w") as f:
                json.dump(self.checkpoint_meta(), f, indent=1)
        dist.barrier()

    def checkpoint_meta(self) -> Dict[str, Any]:
        """What rebuilds this engine around its checkpoint: the base model (a LoRA checkpoint holds only the
        adapters), the kind, the LoRA settings."""
        lora = self.cfg.lora
        return {
            "backend": "fsdp",
            "kind": self.cfg.kind,
            "model_path": os.path.abspath(self.cfg.model_path),
            "tokenizer_path": self.cfg.tokenizer_path and os.path.abspath(self.cfg.tokenizer_path),
            "dtype": self.cfg.dtype,
            "lora": dataclasses.asdict(lora) if lora is not None else None,
            "override_config": self.cfg.override_config,
        }

    def load_checkpoint(self, path: str) -> None:
        self.params_away.resident()
        with self.optim_away.back():
            state = self._sharded_state()
            dcp.load(state, checkpoint_id=path)
            if self.optimizer is None:
                set_model_state_dict(self.model, state["model"], options=self._state_options())
            else:
                set_state_dict(
                    self.model,
                    self.optimizer,
                    model_state_dict=state["model"],
                    optim_state_dict=state["optim"],
                    options=self._state_options(),
                )
        parts.load_extra(path, self.state)

    def export_hf(self, path: str) -> None:
        """Rank 0 writes safetensors + config + tokenizer (and generation config) to `path`; with LoRA, the
        adapters merged in there, and the adapters alone as a peft folder in `path`/lora_adapter."""
        self.params_away.resident()
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        lora = is_lora(self.model)
        # every rank takes part in the gathers; rank 0 keeps the merged tensors
        merged = {k: v.cpu() for k, v in merged_weights(self.model, _full) if self.rank == 0} if lora else full

        def write() -> None:
            os.makedirs(path, exist_ok=True)
            hf_model = self.model.get_base_model() if lora else self.model
            hf_model.save_pretrained(path, state_dict=merged, safe_serialization=True)
            copy_tokenizer_files(self.cfg.tokenizer_path or self.cfg.model_path, path)
            if lora:  # peft keeps the adapters' own entries of the full state dict
                self.model.save_pretrained(os.path.join(path, LORA_ADAPTER_DIR), state_dict=full)

        parts.export_then_barrier(write)


def _conforms(engine: FSDPEngine) -> TrainEngine:  # (the type checker holds the engine to its protocol)
    return engine
