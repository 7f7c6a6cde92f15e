"""torch implementations of vLLM's core Triton kernels, for tensors on "tpu".

Registered through vLLM's public hook ``Platform.register_triton_kernel_overrides`` /
``vllm.triton_utils.dispatcher.register_kernels`` (the way vLLM's CPU platform supplies
its fallbacks). Each runs as a few native tpu ops, no host round trip.
"""
from __future__ import annotations

import torch


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
        tok = torch.arange(n, dtype=torch.int64, device=pos.device)
        ends = query_start_loc[1:].to(torch.int64)
        # request of each token: how many requests end at or before it
        req = (tok.unsqueeze(1) >= ends.unsqueeze(0)).to(torch.int64).sum(dim=1)
        flat = block_table.reshape(-1)
        blocks = flat.index_select(0, req * int(block_table_stride) + torch.div(pos, bs, rounding_mode="floor"))
        slot_mapping[:n].copy_(blocks.to(torch.int64) * bs + torch.remainder(pos, bs))
    if int(max_num_tokens) > n:
        slot_mapping[n:int(max_num_tokens)].fill_(PAD_ID)


OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
}
