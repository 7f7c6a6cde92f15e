"""vLLM's top-k/top-p sampler on "tpu".

vLLM's native path draws each seeded request's exponential noise with
``q[i].exponential_(generator=g)`` (v1/sample/ops/topk_topp_sampler.py, random_sample).
On torchtpu an explicit generator on ``exponential_`` fails: the output-metadata step
runs the op's Meta kernel, which for ``exponential_`` is ``torch._refs.exponential`` and
asserts "generator is not supported in refs" (a torchtpu C++ gap, see docs/vllm.md).
``uniform_(generator=g)`` works, so the noise here is ``-log(1 - u)``: the same
distribution, reproducible per seed. Everything else is vLLM's own code.
"""
from __future__ import annotations

import torch

from vllm.v1.sample.ops.topk_topp_sampler import (
    TopKTopPSampler,
    apply_top_k_top_p,
    empty_exponential_noise_like,
    sample_with_exponential_noise,
)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator],
                  use_fp64_gumbel: bool = False) -> torch.Tensor:
    q = empty_exponential_noise_like(probs, use_fp64_gumbel)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for i, generator in generators.items():
        u = torch.empty_like(q[i]).uniform_(generator=generator)
        q[i] = torch.log1p(-u).neg_()
    return sample_with_exponential_noise(probs, q)


class TpuTopKTopPSampler(TopKTopPSampler):
    def __init__(self, logprobs_mode="raw_logprobs", use_fp64_gumbel: bool = False) -> None:
        super().__init__(logprobs_mode, use_fp64_gumbel)
        self.forward = self.forward_native

    def forward_native(self, logits, generators, k, p):
        logits = apply_top_k_top_p(logits, k, p)
        logits_to_return = None
        if self.logprobs_mode == "processed_logits":
            logits_to_return = logits
        elif self.logprobs_mode == "processed_logprobs":
            logits_to_return = logits.log_softmax(dim=-1, dtype=torch.float32)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return random_sample(probs, generators, self.use_fp64_gumbel), logits_to_return
