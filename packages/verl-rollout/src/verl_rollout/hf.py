"""The `hf` rollout engine: batched sampling with transformers' `generate`.

Colocated with the actor (the hybrid engine), it generates with the actor's own module: the FSDP shards are
gathered for the duration of generation and released after, so no second copy of the weights exists and a
weight sync moves nothing. Built without a shared module (a megatron actor, whose shards HF cannot run), it
keeps its own copy, takes new weights from the actor's per-tensor iterator, and releases that copy while
asleep (`sleep()`, during the actor's update), so the copy exists only between a weight sync and training.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, Optional

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

from verl.data.vision import is_vision_model, rope_index_module, stacked_images, vision_token_ids
from verl.engine_protocol import (
    ROUTED_EXPERTS,
    CheckedRolloutEngine,
    RolloutEngine,
    RolloutSettings,
    TrainEngine,
    Weights,
)
from verl.protocol import DataProto
from verl.rollout_batch import assemble_rollout
from verl.workers.weight_check import Fingerprint, Target, fingerprint
from verl_rollout.hf_weights import renames, target
from verl_rollout.routes import RouteRecorder


class HFRollout:
    def __init__(
        self,
        cfg,  # verl.config.schema.RolloutConfig
        *,
        model_path: str,
        settings: RolloutSettings,
        module: Optional[torch.nn.Module] = None,
        gather: Optional[Callable[[], ContextManager]] = None,
    ):
        """Generates with transformers on `module` (a colocated actor's, unsharded by `gather`), else its own copy
        of `model_path`; of `settings` it takes the lengths, token ids and device."""
        self.cfg = cfg
        self.max_new_tokens = settings.max_new_tokens
        self.eos_ids = list(settings.eos_ids)
        self.pad_token_id = settings.pad_id
        self.device = torch.device(settings.device)
        self.shared = module is not None
        if module is None:
            vision = is_vision_model(AutoConfig.from_pretrained(model_path))
            auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
            module = auto.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
            module.to(self.device)
        self.module: Any = module  # (a transformers model: its generate is not in torch.nn.Module's type)
        self.gather = gather or contextlib.nullcontext
        self._released: Optional[dict] = None  # name -> shape of parameters released by sleep()
        self._meta: Optional[Dict[str, torch.Tensor]] = None  # the parameters on the meta device (fingerprint_key)
        self._renamed: Optional[Dict[str, str]] = None  # checkpoint names of renamed parameters (hf_weights.renames)
        # A vision-language model never samples its image markers (the actor counts them against the images), and
        # its positions are its own 3-D ones, from offsets its model keeps per call (`rope_deltas`).
        self.positions = rope_index_module(module) if is_vision_model(module.config) else None
        self.suppress = vision_token_ids(module.config) if self.positions is not None else []
        # routing replay r3: the experts every token went to come back as a batch column
        self.recorder = RouteRecorder(module) if settings.routes else None

    @classmethod
    def build(
        cls, cfg, *, model_path: str, settings: RolloutSettings, actor: Optional[TrainEngine] = None
    ) -> "HFRollout":
        """A colocated FSDP actor's module is shared (generation runs on its gathered shards), otherwise the engine
        loads its own copy."""
        in_place = actor is not None and actor.gathered is not None  # (TrainEngine.gathered, TrainEngine.model)
        shared = dict(module=actor.model, gather=actor.gathered) if in_place else {}
        return cls(cfg, model_path=model_path, settings=settings, **shared)

    def _generation_config(self, temperature: float, max_new_tokens: int) -> GenerationConfig:
        sample = temperature > 0
        kwargs = dict(
            do_sample=sample,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if self.suppress:  # (the log-probs stay the raw logits', as the actor computes them)
            kwargs["suppress_tokens"] = self.suppress
        if sample:
            kwargs.update(
                temperature=temperature,
                top_p=self.cfg.top_p,
                top_k=self.cfg.top_k if self.cfg.top_k > 0 else 0,
            )
        return GenerationConfig(**kwargs)

    @torch.no_grad()
    def generate(
        self, prompts: DataProto, *, n: int = 1, temperature: Optional[float] = None, max_new_tokens: int = 0
    ) -> DataProto:
        """max_new_tokens: this call's limit (0: the run's); the responses are that wide."""
        if self._released is not None:
            raise RuntimeError(
                "the rollout's weights were released (sleep, while the actor trained); sync the actor's weights "
                "into it (update_weights) before generating"
            )
        unique_ids = prompts.batch["input_ids"].to(self.device)
        unique_mask = prompts.batch["attention_mask"].to(self.device)
        if n > 1:
            prompts = prompts.repeat(n, interleave=True)
        ids = prompts.batch["input_ids"].to(self.device)
        mask = prompts.batch["attention_mask"].to(self.device)
        p = ids.shape[1]
        temperature = self.cfg.temperature if temperature is None else temperature
        width = max_new_tokens or self.max_new_tokens
        was_training = self.module.training
        self.module.eval()
        recording = self.recorder.recording() if self.recorder is not None else contextlib.nullcontext()
        images = stacked_images(prompts.non_tensor_batch.get("multi_modal_inputs"))
        extra: Dict[str, Any] = {}
        if images is not None:  # the pixels of every sample's prompt; the model places them at its image tokens
            extra = {k: v.to(self.device) for k, v in images.items()}
            extra["mm_token_type_ids"] = (ids == self.module.config.image_token_id).int()
        with self.gather(), recording:
            # n samples of a prompt share its prefill: the KV cache of all but its last token is computed once
            # and repeated n times; generate then starts from the last prompt token. (Not for a vision-language
            # model: generate's first step sets up its 3-D positions, from offsets of this call's rows only.)
            if self.positions is not None:
                self.positions.rope_deltas = None  # (the last call's: other rows, another batch size)
            shared = n > 1 and p > 1 and self.positions is None
            cache = self._prefill(unique_ids[:, :-1], unique_mask[:, :-1], n) if shared else None
            if cache is not None:
                extra["cache"] = cache
            out = self.module.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=self._generation_config(temperature, width),
                **extra,
            )
        self.module.train(was_training)

        responses = out.sequences[:, p:].cpu()
        # The log-probs the sampler used: raw logits scaled by the temperature (before top-k/top-p).
        logits = torch.stack(out.logits, dim=1).float() / (temperature if temperature > 0 else 1.0)
        log_probs = torch.log_softmax(logits, -1).gather(-1, responses.to(logits.device).unsqueeze(-1)).squeeze(-1)
        # Fixed width R = max_new_tokens; rows that stopped early were padded by generate (the mask ends at eos).
        generated = responses.shape[1]
        pad = width - generated
        responses = torch.nn.functional.pad(responses, (0, pad), value=self.pad_token_id)
        log_probs = torch.nn.functional.pad(log_probs.cpu(), (0, pad), value=0.0)
        lengths = torch.full((len(responses),), generated)
        batch = assemble_rollout(prompts, responses, log_probs, lengths, eos_ids=self.eos_ids)
        if self.recorder is not None:
            shared = len(unique_ids) if cache is not None else None
            routes = self.recorder.routes(len(responses), p + width, prefill_rows=shared, n=n)
            batch = batch.union(DataProto.from_dict({ROUTED_EXPERTS: routes}))
        return batch

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, n: int) -> Any:
        """The KV cache of `ids` (positions as generate gives them: from the first real token), each row's
        repeated n times in place."""
        position_ids = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        out = self.module(
            input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, logits_to_keep=1
        )
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        cache.batch_repeat_interleave(n)
        return cache

    def update_weights(self, weights: Weights) -> int:
        """Copy new weights into this engine's own module; a shared module already has them (0 bytes).

        After a sleep every parameter must arrive (the released ones hold no values)."""
        if self.shared:
            return 0  # the iterator is lazy: not consuming it gathers nothing
        released = self._released
        self.wake()
        params = {n: p.data for n, p in self.module.named_parameters()}
        moved, seen = 0, set()
        for name, tensor in weights:  # checkpoint names (a mixture of experts' land in fused parameters)
            param, view = target(name, params, self._renames)
            view.copy_(tensor.to(view.device, view.dtype))
            moved += tensor.numel() * tensor.element_size()
            seen.add(param)
        missing = sorted(set(released or ()) - seen)
        if missing:
            self._released = released  # still without values: refuse to generate with them
            raise KeyError(f"the weights sent after a sleep lack {missing[:5]} ({len(missing)} in all)")
        return moved

    def fingerprint_key(self, name: str) -> Target:
        """The parameter checkpoint tensor `name` is loaded into, and its dtype."""
        if self._meta is None:  # the parameters' shapes and dtypes, read once (a released one's shape kept by sleep)
            shapes = self._released or {n: p.shape for n, p in self.module.named_parameters()}
            dtypes = {n: p.dtype for n, p in self.module.named_parameters()}
            self._meta = {n: torch.empty(shapes[n], dtype=dtypes[n], device="meta") for n in dtypes}
        param, view = target(name, self._meta, self._renames)
        return Target(param, view.dtype)

    def _renames(self) -> Dict[str, str]:
        if self._renamed is None:
            self._renamed = renames(self.module)
        return self._renamed

    def weight_fingerprints(self) -> Optional[Dict[str, Optional[Fingerprint]]]:
        """Each parameter's fingerprint; None for a shared module (the actor's own: a sync moves nothing)."""
        if self.shared:
            return None
        return {n: fingerprint(p) for n, p in self.module.named_parameters()}

    def sleep(self) -> None:
        """Release this engine's own copy of the weights (a shared module is the actor's: kept).

        transformers keeps no KV cache between generate calls, so the weights are all there is to free."""
        if self.shared or self._released is not None:
            return
        self._released = {}
        for name, p in self.module.named_parameters():
            self._released[name] = p.shape
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    def wake(self) -> None:
        """Allocate the released parameters again (uninitialised: update_weights fills them)."""
        if self._released is None:
            return
        for name, p in self.module.named_parameters():
            p.data = torch.empty(self._released[name], dtype=p.dtype, device=p.device)
        self._released = None


def _conforms(engine: HFRollout) -> RolloutEngine:  # (the type checker holds the engine to its protocols)
    checked: CheckedRolloutEngine = engine
    return checked
