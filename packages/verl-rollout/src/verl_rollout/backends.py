"""What this package registers under the `verl.backends` entry-point group (kept import-light)."""

from verl.backends import BackendSpec

HF = BackendSpec(
    name="hf", kind="rollout", package="verl-rollout", requires=("transformers",), engine="verl_rollout.hf:HFRollout"
)
# vLLM and SGLang are optional extras: their wheels are large and CUDA-specific.
VLLM = BackendSpec(name="vllm", kind="rollout", package="verl-rollout", requires=("vllm",), extra="verl-rollout[vllm]")
SGLANG = BackendSpec(
    name="sglang", kind="rollout", package="verl-rollout", requires=("sglang",), extra="verl-rollout[sglang]"
)
BACKENDS = (HF, VLLM, SGLANG)
