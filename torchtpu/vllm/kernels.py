"""torch implementations of vLLM's core Triton kernels, for tensors on "tpu".

Registered through vLLM's public hook ``Platform.register_triton_kernel_overrides`` /
``vllm.triton_utils.dispatcher.register_kernels`` (the way vLLM's CPU platform supplies
its fallbacks). Each runs as a few native tpu ops, no host round trip.
"""
from __future__ import annotations

import torch


def _token_layout(cu: torch.Tensor, num_tokens: int):
    """For ``num_tokens`` tokens of requests laid out by cumulative end offsets ``cu`` [batch]:
    the token indices, each token's request (how many requests end at or before it), and each
    request's start and length."""
    cu = cu.to(torch.int64)
    tok = torch.arange(num_tokens, dtype=torch.int64, device=cu.device)
    req = (tok.unsqueeze(1) >= cu.unsqueeze(0)).to(torch.int64).sum(dim=1)
    starts = torch.cat([cu.new_zeros(1), cu[:-1]])
    return tok, req.clamp(max=max(cu.shape[0] - 1, 0)), starts, cu - starts


def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,  # [num_reqs + 1] int32
    positions: torch.Tensor,  # [num_tokens] int64
    block_table: torch.Tensor,  # [max_num_reqs, max_num_blocks_per_req] int32
    block_table_stride: int,
    slot_mapping: torch.Tensor,  # [max_num_tokens] int64, written
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int = 1,
    TOTAL_CP_RANK: int = 0,
    CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,
    PAD_ID: int = -1,
    BLOCK_SIZE: int = 1024,
) -> None:
    """vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel: the KV cache slot of each
    scheduled token, ``block_table[req, pos // bs] * bs + pos % bs``; PAD_ID past num_tokens."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("torchtpu: context parallelism (DCP/PCP) is not supported")
    n = int(num_tokens)
    bs = int(KV_CACHE_BLOCK_SIZE)
    if n > 0:
        pos = positions[:n].to(torch.int64)
        _, req, _, _ = _token_layout(query_start_loc[1:], n)
        flat = block_table.reshape(-1)
        blocks = flat.index_select(0, req * int(block_table_stride) + torch.div(pos, bs, rounding_mode="floor"))
        slot_mapping[:n].copy_(blocks.to(torch.int64) * bs + torch.remainder(pos, bs))
    if int(max_num_tokens) > n:
        slot_mapping[n:int(max_num_tokens)].fill_(PAD_ID)


def _accept_prefix(output, cu, values, accepted, bonus, active, max_spec_len):
    """The rejection samplers' common write: per request, the tokens up to and including the
    first rejected one (``values``), then the bonus token if none was rejected; only requests
    with ``active`` set are written (the Triton kernels' early exit)."""
    n = values.shape[0]
    width = int(max_spec_len) + 1
    flat = output.view(-1)
    b = cu.shape[0]
    tok, req, starts, lens = _token_layout(cu, n)
    if n:
        bad = (~accepted).to(torch.int64)
        excl = torch.cumsum(bad, 0) - bad
        before = excl - excl.index_select(0, starts.clamp(max=n - 1)).index_select(0, req)
        write = (before == 0) & active.index_select(0, req)
        idx = req * width + (tok - starts.index_select(0, req))
        cur = flat.index_select(0, idx)
        flat.index_copy_(0, idx, torch.where(write, values.to(flat.dtype), cur))
        n_bad = torch.zeros(b, dtype=torch.int64, device=flat.device).index_add_(0, req, bad)
    else:
        n_bad = torch.zeros(b, dtype=torch.int64, device=flat.device)
    bidx = torch.arange(b, dtype=torch.int64, device=flat.device) * width + lens
    cur = flat.index_select(0, bidx)
    flat.index_copy_(0, bidx, torch.where((n_bad == 0) & active, bonus.reshape(-1).to(flat.dtype), cur))


def _no_synthetic(rates) -> None:
    if rates is not None:
        raise NotImplementedError("torchtpu's vLLM platform: synthetic rejection sampling "
                                  "(speculative_config synthetic acceptance rates) is not supported")


def rejection_greedy_sample(output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr,
                            target_argmax_ptr, bonus_token_ids_ptr, is_greedy_ptr, max_spec_len,
                            uniform_probs_ptr, synthetic_conditional_rates_ptr, SYNTHETIC_MODE=False):
    """vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel: a greedy request keeps
    the target's argmax up to the first draft token that differs from it, then the bonus token
    if every draft token matched."""
    _no_synthetic(synthetic_conditional_rates_ptr)
    cu = cu_num_draft_tokens_ptr
    draft, argmax = draft_token_ids_ptr.to(torch.int64), target_argmax_ptr.to(torch.int64)
    active = (torch.ones(cu.shape[0], dtype=torch.bool, device=cu.device) if is_greedy_ptr is None
              else is_greedy_ptr.to(torch.bool))
    _accept_prefix(output_token_ids_ptr, cu, argmax, draft == argmax, bonus_token_ids_ptr, active, max_spec_len)


def rejection_random_sample(output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr, draft_probs_ptr,
                            target_probs_ptr, bonus_token_ids_ptr, recovered_token_ids_ptr, uniform_probs_ptr,
                            is_greedy_ptr, max_spec_len, vocab_size, synthetic_conditional_rates_ptr,
                            NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False):
    """vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel: a sampled request
    accepts draft token d with probability min(1, p_target(d) / p_draft(d)) (p_draft = 1 without
    draft probabilities), else takes the recovered token and stops."""
    _no_synthetic(synthetic_conditional_rates_ptr)
    draft = draft_token_ids_ptr.to(torch.int64)
    n = draft.shape[0]
    safe = draft.clamp(min=0).unsqueeze(1)
    target_p = target_probs_ptr.reshape(n, -1).gather(1, safe).squeeze(1) if n else draft.float()
    if draft_probs_ptr is None:
        draft_p = torch.ones_like(target_p)
    else:
        draft_p = draft_probs_ptr.reshape(n, -1).gather(1, safe).squeeze(1)
    accepted = (draft >= 0) & (draft_p > 0) & (target_p / draft_p >= uniform_probs_ptr.to(target_p.dtype))
    values = torch.where(accepted, draft, recovered_token_ids_ptr.to(torch.int64))
    active = ~is_greedy_ptr.to(torch.bool)
    _accept_prefix(output_token_ids_ptr, cu_num_draft_tokens_ptr, values, accepted, bonus_token_ids_ptr, active,
                   max_spec_len)


def expand(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vllm.v1.sample.rejection_sampler.expand_kernel: each request's value repeated over its
    tokens (``replace_from`` replaced by ``replace_to``)."""
    n = output_ptr.shape[0]
    if n == 0:
        return
    cu = cu_num_tokens_ptr.to(torch.int64)
    tok, req, _, _ = _token_layout(cu, n)
    src = input_ptr.index_select(0, req)
    src = torch.where(src == replace_from, torch.full_like(src, replace_to), src)
    inside = tok < cu[-1]
    output_ptr.copy_(torch.where(inside, src.to(output_ptr.dtype), output_ptr))


def sample_recovered_tokens(output_token_ids_ptr, cu_num_draft_tokens_ptr, draft_token_ids_ptr, draft_probs_ptr,
                            target_probs_ptr, inv_q_ptr, vocab_size, BLOCK_SIZE=None, NO_DRAFT_PROBS=False,
                            USE_FP64_GUMBEL=False):
    """vllm.v1.sample.rejection_sampler.sample_recovered_tokens_kernel: argmax over the vocabulary
    of max(p_target - p_draft, 0) (p_target without the draft token when there are no draft
    probabilities) times the request's exponential noise ``inv_q`` (Gumbel-max sampling)."""
    n = output_token_ids_ptr.shape[0]
    if n == 0:
        return
    _, req, _, _ = _token_layout(cu_num_draft_tokens_ptr, n)
    target = target_probs_ptr.reshape(n, -1)
    if draft_probs_ptr is None:
        draft = draft_token_ids_ptr.to(torch.int64).clamp(min=0).unsqueeze(1)
        prob = target.scatter(1, draft, torch.zeros_like(target[:, :1]))
    else:
        prob = (target - draft_probs_ptr.reshape(n, -1)).clamp(min=0)
    score = prob.to(inv_q_ptr.dtype) * inv_q_ptr.index_select(0, req)
    output_token_ids_ptr.copy_(score.argmax(dim=1).to(output_token_ids_ptr.dtype))


OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
    # speculative decoding's rejection sampler (vllm/v1/sample/rejection_sampler.py)
    "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel": rejection_greedy_sample,
    "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel": rejection_random_sample,
    "vllm.v1.sample.rejection_sampler.expand_kernel": expand,
    "vllm.v1.sample.rejection_sampler.sample_recovered_tokens_kernel": sample_recovered_tokens,
}
