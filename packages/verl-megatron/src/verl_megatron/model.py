"""Build this rank's megatron-core GPT model chunks from a Hugging Face config.

A chunk is a `GPTHidden`: megatron's GPTModel whose last pipeline stage returns the final hidden states
instead of logits. The engine turns hidden states into log-probs with the vocab-parallel output weight shard
(no full-vocabulary logits), or into values with a scalar head (`kind="value"`, HF's `score` head).
"""

from __future__ import annotations

import copy
import importlib.util
from typing import Any, Dict, List, Optional

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule

from verl_megatron.hf_config import gpt_model_kwargs, transformer_config_kwargs
from verl_megatron.moe import define_missing_te_names, moe_config_kwargs
from verl_megatron.parallel import Layout

KINDS = ("causal_lm", "value")


def transformer_engine_available(device: str) -> bool:
    """TransformerEngine layers are used on GPU when the package is installed; CPU runs use megatron's own."""
    return device != "cpu" and importlib.util.find_spec("transformer_engine") is not None


def layer_spec(hf_config: Any, te: bool, *, moe: bool = False):
    """megatron's GPT layer spec: TransformerEngine's fused layers, or the local (pure torch) ones; `moe`: the
    layer's MLP is the model's mixture of experts (grouped GEMM experts with TransformerEngine, else one MLP each)."""
    kwargs = transformer_config_kwargs(hf_config)
    qk_norm = kwargs["qk_layernorm"]
    experts = kwargs.get("num_moe_experts") if moe else None
    if te:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(
            num_experts=experts, moe_grouped_gemm=experts is not None, qk_layernorm=qk_norm
        )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return get_gpt_layer_local_spec(num_experts=experts, qk_layernorm=qk_norm, normalization="RMSNorm")


class TorchNorm:
    """torch's RMSNorm/LayerNorm for megatron's local layer spec, usable with sequence parallelism.

    Under sequence parallelism each tensor-parallel rank normalises a different part of the sequence, so the
    norm weights' gradients differ between the ranks; marking them `sequence_parallel` makes megatron sum them
    over the TP group (what apex's and TransformerEngine's norms do; megatron's WrappedTorchNorm refuses the
    setting). Built where and in the dtype megatron builds the layer's other weights."""

    def __new__(  # type: ignore[misc]  # (a factory: the instance is megatron's norm, not this class's)
        cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: Any
    ) -> torch.nn.Module:
        kinds = {"RMSNorm": torch.nn.RMSNorm, "LayerNorm": torch.nn.LayerNorm}
        if config.normalization not in kinds:
            raise ValueError(f"normalization '{config.normalization}' is not one of {', '.join(kinds)}")
        for flag in ("layernorm_zero_centered_gamma", "persist_layer_norm", "memory_efficient_layer_norm"):
            if getattr(config, flag):
                raise ValueError(f"megatron's {flag}=True needs TransformerEngine or apex norms")
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        norm = kinds[config.normalization](hidden_size, eps=eps, device=device, dtype=config.params_dtype)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def block_spec(hf_config: Any, config: TransformerConfig, te: bool, vp_stage: Optional[int]):
    """The layer specs of one model chunk. Without TransformerEngine every norm is a TorchNorm (sequence
    parallel capable; apex's fused norm has no RMSNorm), and context parallelism gets all-gather attention."""
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.transformer_block import (
        LayerNormImpl,
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from verl_megatron.context_parallel import AllGatherContextAttention
    from verl_megatron.thd_attention import ThdLocalAttention

    def local(spec):
        spec = copy.deepcopy(spec)
        if not te:
            layer, attention = spec.submodules, spec.submodules.self_attention.submodules
            for owner, name in (
                (layer, "input_layernorm"),
                (layer, "pre_mlp_layernorm"),
                (attention, "q_layernorm"),
                (attention, "k_layernorm"),
            ):
                if getattr(owner, name) not in (None, IdentityOp):
                    setattr(owner, name, TorchNorm)
            if config.context_parallel_size > 1:
                attention.core_attention = AllGatherContextAttention
            else:  # also takes the packed THD layout (TransformerEngine's attention does on GPU)
                attention.core_attention = ThdLocalAttention
        return spec

    dense = local(layer_spec(hf_config, te))
    routed = local(layer_spec(hf_config, te, moe=True)) if config.num_moe_experts else None
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    specs = [routed if is_moe_layer(config, offset + i) else dense for i in range(layers)]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=LayerNormImpl if te else TorchNorm)


def is_moe_layer(config: TransformerConfig, layer: int) -> bool:
    """Whether global layer `layer` routes to experts (config.moe_layer_freq: a 0/1 list per layer here)."""
    freq = config.moe_layer_freq
    if not config.num_moe_experts:
        return False
    return bool(freq[layer]) if isinstance(freq, list) else layer % freq == 0


def transformer_config(
    hf_config: Any,
    layout: Layout,
    *,
    dtype: torch.dtype,
    device: str,
    sequence_parallel: bool = False,
    gradient_checkpointing: bool = False,
    moe_aux_loss_coeff: float = 0.0,
    overrides: Optional[Dict[str, Any]] = None,
) -> TransformerConfig:
    """Model shape from the HF config; parallel sizes from the layout; fusions only where their kernels exist."""
    on_gpu = device != "cpu"
    kwargs = transformer_config_kwargs(hf_config)  # refuses what does not convert, by config key
    moe = "num_moe_experts" in kwargs
    if not moe and (layout.ep > 1 or layout.etp not in (None, layout.tp)):
        raise ValueError(
            f"parallel.ep={layout.ep}: expert parallelism splits mixture-of-experts layers, and this "
            f"{hf_config.model_type} model has none; set parallel.ep=1"
        )
    if moe and layout.tp > 1 and not sequence_parallel:
        raise ValueError(
            f"parallel.sequence_parallel=false with tp={layout.tp}: megatron's mixture-of-experts layer trains with "
            "sequence parallelism only; leave parallel.sequence_parallel unset (on with tp > 1)"
        )
    if moe:
        kwargs.update(moe_config_kwargs(hf_config, aux_loss_coeff=moe_aux_loss_coeff))
        kwargs.update(
            expert_tensor_parallel_size=layout.etp or layout.tp,
            moe_grouped_gemm=on_gpu and transformer_engine_available(device),
        )
    kwargs.update(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        sequence_parallel=sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not on_gpu,
        # Fused kernels need apex / TransformerEngine / CUDA; the unfused paths compute the same function.
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        # Pipeline stages exchange shapes per micro-batch, so a last, smaller micro-batch is fine. Not under the
        # interleaved schedule: with two stages its shape exchanges pair up wrongly (the ranks hang, one exchanging
        # shapes, the other tensors), and the engine gives every micro-batch one shape under pipeline stages anyway.
        variable_seq_lengths=layout.pp > 1 and not layout.vpp,
        # Two interleaved stages are each other's previous and next: a batched exchange then posts the activation
        # and the gradient for the same peer in an order the peer does not receive them in, and the two (same
        # shape) swap, silently (measured on gloo: grad norm 134 instead of 1.56). One op at a time, in megatron's
        # even/odd order, matches them.
        batch_p2p_comm=not (layout.vpp and layout.pp == 2),
        # (megatron refuses variable lengths with the default MoE dispatcher, even for dense models)
        moe_token_dispatcher_type="alltoall",
    )
    if gradient_checkpointing:
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    for key, value in (overrides or {}).items():
        if key not in TransformerConfig.__dataclass_fields__:
            raise ValueError(f"megatron override '{key}' is not a TransformerConfig field")
        kwargs[key] = value
    return TransformerConfig(**kwargs)


class GPTHidden(GPTModel):
    """GPTModel whose last stage returns final hidden states [b, s, h]; with `kind="value"` it owns a scalar head."""

    value_head: Optional[torch.nn.Linear]

    def _preprocess(self, input_ids: torch.Tensor, position_ids: torch.Tensor, *args: Any, **kwargs: Any) -> tuple:
        """GPTModel's, with RoPE at each token's own position (`position_ids`) instead of its index in the
        sequence: packed rows restart positions inside a row, and a context-parallel rank's tokens are chunks."""
        out = super()._preprocess(input_ids, position_ids, *args, **kwargs)
        if out[1] is None or position_ids is None or self.position_embedding_type != "rope":
            return out
        if kwargs.get("packed_seq_params") is not None:  # THD: megatron restarts RoPE at each sequence itself
            return out
        table = self.rotary_pos_emb.get_emb(int(position_ids.max()) + 1)  # [positions, 1, 1, dim]
        emb = table[position_ids.to(table.device)][:, :, 0].transpose(0, 1)  # [s, b, 1, dim]
        return (out[0], emb, *out[2:])

    def _postprocess(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not self.post_process:
            return hidden_states  # [s, b, h], sent to the next pipeline stage
        if self.config.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            # The output heads need whole sequences. Their hidden-state gradient is already complete on every TP
            # rank (the vocab-parallel log-prob sums it over the group), so backward keeps this rank's slice.
            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return hidden_states.transpose(0, 1)

    def output_weight(self) -> torch.Tensor:
        """This rank's vocab-parallel shard of the output projection [padded_vocab / tp, h] (last stage)."""
        if self.share_embeddings_and_output_weights:
            return self.shared_embedding_or_output_weight()
        return self.output_layer.weight

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Optional[dict] = None):
        if getattr(self, "value_head", None) is None:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        # A value model has no output layer for GPTModel's tie/padding logic to look at.
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

        return MegatronModule.sharded_state_dict(
            self, prefix, sharded_offsets, ensure_metadata_has_dp_cp_group(metadata)
        )


def build_chunks(
    hf_config: Any,
    config: TransformerConfig,
    layout: Layout,
    *,
    kind: str = "causal_lm",
    te: bool = False,
    seed: int = 1,
) -> List[GPTHidden]:
    """This rank's model chunks (one per virtual pipeline stage), weights initialised but not loaded."""
    from megatron.core import parallel_state as mpu

    if kind not in KINDS:
        raise ValueError(f"model kind '{kind}' is not one of {', '.join(KINDS)}")
    if config.num_moe_experts:
        define_missing_te_names()
    model_kwargs = gpt_model_kwargs(hf_config, layout.tp)
    if kind == "value":  # no output layer to tie to the embedding
        model_kwargs["share_embeddings_and_output_weights"] = False
    chunks = []
    for vp_stage in range(layout.chunks):
        vp = vp_stage if layout.vpp else None
        pre = mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
        post = mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        model = GPTHidden(
            config,
            block_spec(hf_config, config, te, vp),
            pre_process=pre,
            post_process=post,
            vp_stage=vp,
            **model_kwargs,
        )
        model.value_head = None
        if kind == "value" and post:
            del model.output_layer  # never used: values come from the scalar head
            torch.manual_seed(seed)  # the same fresh head on every tensor-parallel rank
            head = torch.nn.Linear(config.hidden_size, 1, dtype=config.params_dtype)
            torch.nn.init.normal_(head.weight, std=config.init_method_std)
            torch.nn.init.zeros_(head.bias)
            model.value_head = head if config.use_cpu_initialization else head.cuda()
        chunks.append(model)
    return chunks
