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


# -- speculative decoding's drafters (EAGLE, draft models: vllm/v1/spec_decode/utils.py)

def eagle_step_slot_mapping_metadata(positions_ptr, block_table_ptr, block_table_stride, seq_lens_ptr,
                                     out_clamped_positions_ptr, out_slot_mapping_ptr, block_size, max_model_len,
                                     n_blocks_per_req, PAD_ID, batch_size):
    """vllm.v1.spec_decode.utils.eagle_step_slot_mapping_metadata_kernel: one drafting step
    forward: position + 1 (0 past max_model_len), its KV slot (PAD_ID past max_model_len and
    for the padding rows after batch_size), seq_lens + 1 (1 past max_model_len) in place."""
    b, bs, limit = int(batch_size), int(block_size), int(max_model_len)
    if b:
        pos = positions_ptr[:b].to(torch.int64) + 1
        exceeds = pos >= limit
        clamped = torch.where(exceeds, torch.zeros_like(pos), pos)
        block = torch.div(clamped, bs, rounding_mode="floor").clamp(max=int(n_blocks_per_req) - 1)
        block_id = block_table_ptr[:b].gather(1, block.unsqueeze(1)).squeeze(1).to(torch.int64)
        slot = torch.where(exceeds, torch.full_like(pos, int(PAD_ID)), block_id * bs + torch.remainder(clamped, bs))
        seq = seq_lens_ptr[:b].to(torch.int64)
        seq = torch.where(exceeds, torch.ones_like(seq), seq + 1).clamp(max=limit)
        out_clamped_positions_ptr[:b].copy_(clamped)
        out_slot_mapping_ptr[:b].copy_(slot)
        seq_lens_ptr[:b].copy_(seq)
    if out_slot_mapping_ptr.shape[0] > b:  # the launch's padding rows (input_batch_size)
        out_slot_mapping_ptr[b:].fill_(int(PAD_ID))


def eagle_prepare_inputs_padded(cu_num_draft_tokens_ptr, valid_sampled_tokens_count_ptr, query_start_loc_gpu_ptr,
                                token_indices_to_sample_ptr, num_rejected_tokens_gpu_ptr, num_reqs):
    """vllm.v1.spec_decode.utils.eagle_prepare_inputs_padded_kernel: per request, the drafts
    rejected (drafts + 1 - valid sampled tokens; 0 without drafts) and the index of the token
    to sample (the request's last query token less the rejected ones)."""
    n = int(num_reqs)
    if n == 0:
        return
    cu = cu_num_draft_tokens_ptr[:n].to(torch.int64)
    drafts = cu - torch.cat([cu.new_zeros(1), cu[:-1]])
    rejected = torch.where(drafts > 0, drafts + 1 - valid_sampled_tokens_count_ptr[:n].to(torch.int64),
                           torch.zeros_like(drafts))
    last = query_start_loc_gpu_ptr[1:n + 1].to(torch.int64) - 1
    token_indices_to_sample_ptr[:n].copy_(last - rejected)
    num_rejected_tokens_gpu_ptr[:n].copy_(rejected)


def eagle_prepare_next_token_padded(sampled_token_ids_ptr, discard_request_mask_ptr, backup_next_token_ids_ptr,
                                    next_token_ids_ptr, valid_sampled_tokens_count_ptr, vocab_size,
                                    num_sampled_tokens_per_req, num_reqs, stride_sampled_token_ids,
                                    BLOCK_SIZE_TOKENS=None):
    """vllm.v1.spec_decode.utils.eagle_prepare_next_token_padded_kernel: per request, how many
    sampled tokens are valid (not -1, inside the vocabulary) and the last valid one; the backup
    token where none is or the request is discarded (count 0 then)."""
    n, w = int(num_reqs), int(num_sampled_tokens_per_req)
    if n == 0:
        return
    tok = sampled_token_ids_ptr[:n, :w].to(torch.int64)
    valid = (tok != -1) & (tok < int(vocab_size))
    count = valid.to(torch.int64).sum(dim=1)
    cols = torch.arange(w, dtype=torch.int64, device=tok.device).expand(n, w)
    last_col = torch.where(valid, cols, torch.full_like(cols, -1)).amax(dim=1)
    last = tok.gather(1, last_col.clamp(min=0).unsqueeze(1)).squeeze(1)
    discard = discard_request_mask_ptr[:n].to(torch.bool)
    backup = backup_next_token_ids_ptr[:n].to(torch.int64)
    next_token_ids_ptr[:n].copy_(torch.where(discard | (count == 0), backup, last))
    valid_sampled_tokens_count_ptr[:n].copy_(torch.where(discard, torch.zeros_like(count), count))


def copy_and_expand_eagle_inputs(target_token_ids_ptr, target_positions_ptr, next_token_ids_ptr, out_input_ids_ptr,
                                 out_positions_ptr, out_is_rejected_token_mask_ptr, out_is_masked_token_mask_ptr,
                                 out_new_token_indices_ptr, out_hidden_state_mapping_ptr, query_start_loc_ptr,
                                 query_end_loc_ptr, padding_token_id, parallel_drafting_token_id, total_input_tokens,
                                 num_padding_slots_per_request, shift_input_ids, BLOCK_SIZE_TOKENS=None):
    """vllm.v1.spec_decode.utils.copy_and_expand_eagle_inputs_kernel: the drafter's first-pass
    inputs when it needs slots of its own (draft models, parallel drafting). Request r's output
    is contiguous: its valid input tokens (shifted by one with ``shift_input_ids``), the bonus
    token, ``P - 1`` parallel-drafting tokens, then one padding token per rejected draft."""
    batch = query_end_loc_ptr.shape[0]
    if batch == 0:
        return
    p, total_in, shift = int(num_padding_slots_per_request), int(total_input_tokens), bool(shift_input_ids)
    dev = target_token_ids_ptr.device
    qs = query_start_loc_ptr[:batch].to(torch.int64)
    nqs = query_start_loc_ptr[1:batch + 1].to(torch.int64)
    qe = query_end_loc_ptr[:batch].to(torch.int64)
    r = torch.arange(batch, dtype=torch.int64, device=dev)
    n_valid = qe - qs + (0 if shift else 1)
    out_start = qs + r * (p - 1 if shift else p)
    n_out = n_valid + p + (nqs - qe - 1)
    total_out = total_in + batch * (p - 1 if shift else p)  # the sum of n_out
    o, req, _, _ = _token_layout(out_start + n_out, total_out)
    j = o - out_start.index_select(0, req)
    nv = n_valid.index_select(0, req)
    src = (qs.index_select(0, req) + (1 if shift else 0) + j).clamp(max=total_in - 1)
    ids = target_token_ids_ptr.to(torch.int64).index_select(0, src)
    ids = torch.where(j == nv, next_token_ids_ptr.to(torch.int64).index_select(0, req), ids)
    parallel = (j > nv) & (j < nv + p)
    rejected = j >= nv + p
    ids = torch.where(parallel, torch.full_like(ids, int(parallel_drafting_token_id)), ids)
    ids = torch.where(rejected, torch.full_like(ids, int(padding_token_id)), ids)
    start_pos = target_positions_ptr.to(torch.int64).index_select(0, qs).index_select(0, req)
    pos = torch.where(rejected, torch.zeros_like(j), start_pos + j)
    out_input_ids_ptr[:total_out].copy_(ids)
    out_positions_ptr[:total_out].copy_(pos)
    out_is_rejected_token_mask_ptr[:total_out].copy_(rejected)
    out_is_masked_token_mask_ptr[:total_out].copy_(parallel)
    new = (out_start + n_valid).unsqueeze(1) + torch.arange(p, dtype=torch.int64, device=dev)
    out_new_token_indices_ptr[:batch * p].copy_(new.reshape(-1))
    if shift:  # input token t of request r lands at out_start[r] + (t - qs[r])
        t, treq, _, _ = _token_layout(nqs, total_in)
        out_hidden_state_mapping_ptr[:total_in].copy_(t + treq * (p - 1))


OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
    # speculative decoding's rejection sampler (vllm/v1/sample/rejection_sampler.py)
    "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel": rejection_greedy_sample,
    "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel": rejection_random_sample,
    "vllm.v1.sample.rejection_sampler.expand_kernel": expand,
    "vllm.v1.sample.rejection_sampler.sample_recovered_tokens_kernel": sample_recovered_tokens,
    # the EAGLE / draft-model proposers (vllm/v1/spec_decode/llm_base_proposer.py)
    "vllm.v1.spec_decode.utils.eagle_step_slot_mapping_metadata_kernel": eagle_step_slot_mapping_metadata,
    "vllm.v1.spec_decode.utils.eagle_prepare_inputs_padded_kernel": eagle_prepare_inputs_padded,
    "vllm.v1.spec_decode.utils.eagle_prepare_next_token_padded_kernel": eagle_prepare_next_token_padded,
    "vllm.v1.spec_decode.utils.copy_and_expand_eagle_inputs_kernel": copy_and_expand_eagle_inputs,
}
