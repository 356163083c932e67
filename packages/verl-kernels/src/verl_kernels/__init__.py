"""verl-kernels: fused log-prob/entropy from hidden states without materialising full-vocabulary logits."""

from verl_kernels.api import IMPLS, linear_logprob_entropy
from verl_kernels.reference import linear_logprob_entropy_reference
from verl_kernels.vocab_parallel import vocab_parallel_linear_logprob_entropy

__all__ = [
    "IMPLS",
    "linear_logprob_entropy",
    "linear_logprob_entropy_reference",
    "vocab_parallel_linear_logprob_entropy",
]
