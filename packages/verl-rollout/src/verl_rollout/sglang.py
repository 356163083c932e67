"""The `sglang` rollout engine: an SGLang `Engine` on the actor's GPU (GPU only; SGLang has no CPU build here).

Same contract as the vllm engine:
- Prompts go in as token ids (`skip_tokenizer_init`), n samples per prompt are n adjacent requests (SGLang's
  radix cache shares their prompt), eos ids stop generation, and the sampled tokens' log-probs come back.
- New weights go in from the actor's per-tensor iterator with `update_weights_from_tensor`, in buckets of
  `BUCKET_BYTES` so the scheduler process maps a few large CUDA IPC handles instead of one per tensor.
- With `free_cache_engine`, SGLang's memory saver releases the KV cache and the weights while the actor trains
  (`sleep`), and takes them back for the next sync (`wake`).
Generation tensor parallelism > 1 is not supported by this engine yet (validation refuses it).
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

import torch

from verl.engine_protocol import RolloutEngine, RolloutSettings, Weights
from verl.protocol import DataProto
from verl.rollout_batch import assemble_rollout, pad_rows, unpadded_prompts

BUCKET_BYTES = 512 << 20


def buckets(weights: Weights, limit: int = BUCKET_BYTES) -> Iterator[List[Tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of at most `limit` bytes (a larger tensor travels alone)."""
    bucket: List[Tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


class SGLangRollout:
    def __init__(
        self,
        cfg,  # verl.config.schema.RolloutConfig
        *,
        model_path: str,
        settings: RolloutSettings,
    ):
        """SGLang's engine on this process's GPU; it keeps its own weights and takes full ones after each update
        (validate refuses rollout.lora_sync=adapter for it, so `settings.lora_rank` is 0)."""
        device, max_prompt_length, max_new_tokens = settings.device, settings.max_prompt_length, settings.max_new_tokens
        if not device.startswith("cuda") or not torch.cuda.is_available():
            raise RuntimeError("the sglang rollout runs on CUDA GPUs only; use rollout.backend=vllm or hf on CPU")
        if int(cfg.parallel.tp or 1) != 1:
            raise ValueError("rollout.parallel.tp: the sglang rollout supports tp=1; use vllm for tensor parallel")
        import sglang  # pants: no-infer-dep (a GPU-only optional extra; in no resolve here)

        self.cfg = cfg
        self.max_new_tokens = max_new_tokens
        self.eos_ids = list(settings.eos_ids)
        self.pad_token_id = settings.pad_id
        self.memory_saver = bool(cfg.free_cache_engine)
        kwargs: dict[str, Any] = dict(
            model_path=model_path,
            skip_tokenizer_init=True,
            dtype=settings.dtype,
            random_seed=settings.seed,
            mem_fraction_static=float(cfg.gpu_memory_utilization),
            enable_memory_saver=self.memory_saver,
            base_gpu_id=torch.cuda.current_device(),
            log_level="error",
        )
        if max_prompt_length:
            kwargs["context_length"] = max_prompt_length + max_new_tokens
        self.engine = sglang.Engine(**kwargs)
        self.kv_released = self.weights_released = self.weights_stale = False

    @classmethod
    def build(cls, cfg, *, model_path: str, settings: RolloutSettings, actor: Optional[Any] = None) -> "SGLangRollout":
        return cls(cfg, model_path=model_path, settings=settings)

    def _sampling(self, temperature: float, max_new_tokens: int) -> dict:
        sample = temperature > 0
        return {
            "temperature": float(temperature) if sample else 0.0,
            "top_p": float(self.cfg.top_p) if sample else 1.0,
            "top_k": int(self.cfg.top_k) if sample and self.cfg.top_k > 0 else -1,
            "max_new_tokens": max_new_tokens,
            "stop_token_ids": self.eos_ids,
        }

    @torch.no_grad()
    def generate(
        self, prompts: DataProto, *, n: int = 1, temperature: Optional[float] = None, max_new_tokens: int = 0
    ) -> DataProto:
        """max_new_tokens: this call's limit (0: the run's); the responses are that wide."""
        if self.weights_stale:
            raise RuntimeError(
                "the rollout's weights were released (sleep, while the actor trained); sync the actor's weights "
                "into it (update_weights) before generating"
            )
        if self.kv_released:
            self.engine.resume_memory_occupation(tags=["kv_cache"])
            self.kv_released = False
        if n > 1:
            prompts = prompts.repeat(n, interleave=True)
        temperature = self.cfg.temperature if temperature is None else temperature
        width = max_new_tokens or self.max_new_tokens
        outputs = self.engine.generate(
            input_ids=unpadded_prompts(prompts), sampling_params=self._sampling(temperature, width), return_logprob=True
        )
        tokens, log_probs = [], []
        for out in outputs:
            tokens.append(list(out["output_ids"]))
            log_probs.append([lp for lp, _tok, _text in out["meta_info"]["output_token_logprobs"]])
        responses = pad_rows(tokens, width, self.pad_token_id, torch.long)
        lp = pad_rows(log_probs, width, 0.0, torch.float32)
        lengths = torch.tensor([len(t) for t in tokens])
        return assemble_rollout(prompts, responses, lp, lengths, eos_ids=self.eos_ids)

    def update_weights(self, weights: Weights) -> int:
        """Send the actor's full tensors (Hugging Face names, on this GPU) in buckets; returns bytes loaded."""
        self.wake()
        moved = 0
        for bucket in buckets((name, t.cuda()) for name, t in weights):
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)
            moved += sum(t.numel() * t.element_size() for _, t in bucket)
        self.engine.flush_cache()  # cached prefixes were computed with the old weights
        self.weights_stale = False
        return moved

    def sleep(self) -> None:
        """Release the KV cache and the weights (memory saver) while the actor trains."""
        if self.memory_saver and not self.weights_released:
            self.engine.release_memory_occupation(tags=["kv_cache", "weights"])
            self.kv_released = self.weights_released = self.weights_stale = True

    def wake(self) -> None:
        """Take the weights' memory back (the next update_weights fills it); the KV cache returns on generate."""
        if self.weights_released:
            self.engine.resume_memory_occupation(tags=["weights"])
            self.weights_released = False


def _conforms(engine: SGLangRollout) -> RolloutEngine:  # (the type checker holds the engine to its protocol)
    return engine
