"""Paged attention for vLLM on "tpu": torchtpu's one paged-attention op (torchtpu/paged.py).

KV cache of one layer: a tensor ``[num_blocks, block_size, num_kv_heads, head_size + head_size_v]``
(keys then values along the last axis), handed to vLLM as its logical ``[B, H, N, C]`` view
(layout LBNHC); :func:`kv_base` is the tensor itself again.

* write: :func:`torchtpu.paged.write_kv` of the step's keys|values into their slots
  (``do_kv_cache_update``; vLLM calls it before ``forward``, ``forward_includes_kv_cache_update
  = False``);
* read: ``torch.ops.torchtpu.paged_attention`` over the whole (padded) batch: one program per
  layer in eager steps, one node of the step's graph in compiled steps (torchtpu/vllm/compiler.py).

The metadata builder makes the per-step metadata fixed-shape tensors: ``query_start_loc``
``[R+1]`` and ``seq_lens`` ``[R]`` with R = ``max_num_seqs`` (padding requests: no rows, length
0; uploaded as one host array) and vLLM's block table padded to R rows (its width is already
``max_model_len / block_size``). Their shapes never change, so the op's program depends on the
token count only, and a compiled step's program on its token bucket only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from torchtpu.paged import paged_attention, step_metadata, write_kv
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadata,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.kv_cache_layout import KVCacheLayout


BACKEND_NAME = "TORCHTPU_PAGED"
BACKEND_QUALNAME = "torchtpu.vllm.attention.TpuPagedAttentionBackend"


def ensure_registered() -> None:
    """Adds TORCHTPU_PAGED to vLLM's attention-backend registry (idempotent), so
    ``--attention-backend TORCHTPU_PAGED`` names it and the Attention layer finds it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        register_backend(BACKEND_NAME, BACKEND_QUALNAME)


def kv_base(kv_cache: torch.Tensor) -> torch.Tensor:
    """[B, H, N, C] (the LBNHC view vLLM holds) -> the [B, N, H, C] cache tensor (same storage)."""
    return kv_cache.permute(0, 2, 1, 3)


class TpuPagedAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16", "float32"]
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        # A member of vLLM's AttentionBackendEnum (the Attention layer looks its name up
        # there): added by register_backend() below, vLLM's public registry.
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type["TpuPagedAttentionImpl"]:
        return TpuPagedAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["TpuPagedAttentionMetadataBuilder"]:
        return TpuPagedAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_non_causal(cls) -> bool:
        return False


@dataclass
class TpuPagedAttentionMetadata(AttentionMetadata):
    num_actual_tokens: int
    num_reqs: int
    query_start_loc: torch.Tensor  # [R+1] int32 (padding requests repeat the last offset)
    seq_lens: torch.Tensor         # [R] int32 (padding requests: 0)
    block_table: torch.Tensor      # [R, W] int32


class TpuPagedAttentionMetadataBuilder(AttentionMetadataBuilder[TpuPagedAttentionMetadata]):
    # Every batch (mixed prefill and decode) runs inside one compiled step program.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.ALWAYS
    reorder_batch_threshold: int | None = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        # The group spec's sliding_window is a KV-management hint: with the hybrid KV cache
        # manager off, vLLM merges sliding and full layers into one FullAttentionSpec carrying
        # the window (kv_cache_interface.py FullAttentionSpec.merge). Each layer applies its
        # own window (TpuPagedAttentionImpl).
        sched = getattr(vllm_config, "scheduler_config", None)
        self.max_reqs = sched.max_num_seqs if sched is not None else 0

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TpuPagedAttentionMetadata:
        cm = common_attn_metadata
        n_req, n_tok = cm.num_reqs, cm.num_actual_tokens
        R = max(self.max_reqs, n_req)
        qsl = cm.query_start_loc_cpu[: n_req + 1].numpy()
        if cm.seq_lens_cpu_upper_bound is not None:  # exact without async spec decode (off here)
            seq = cm.seq_lens_cpu_upper_bound[:n_req].numpy()
        else:
            seq = cm.seq_lens[:n_req].cpu().numpy()
        qsl_dev, seq_dev = step_metadata(qsl, seq, R, self.device)
        table = cm.block_table_tensor[:n_req].to(torch.int32)
        if table.shape[0] < R:
            table = torch.nn.functional.pad(table, (0, 0, 0, R - table.shape[0]))
        return TpuPagedAttentionMetadata(num_actual_tokens=n_tok, num_reqs=n_req, query_start_loc=qsl_dev,
                                         seq_lens=seq_dev, block_table=table)


    def build_for_drafting(self, common_attn_metadata: CommonAttentionMetadata,
                           draft_index: int) -> TpuPagedAttentionMetadata:
        """Speculative decoding's drafter (EAGLE, draft models) moves its metadata on the
        device between its passes (vllm/v1/spec_decode/llm_base_proposer.py: query offsets
        extended, rejected tokens subtracted from ``seq_lens``, ``seq_lens`` advanced in place by
        each step), leaving the host copies stale upper bounds: the device tensors are the truth,
        padded to the fixed request rows on the device (no host round trip)."""
        cm = common_attn_metadata
        n_req = cm.num_reqs
        R = max(self.max_reqs, n_req)
        qsl = cm.query_start_loc[: n_req + 1].to(torch.int32)
        seq = cm.seq_lens[:n_req].to(torch.int32)
        if R > n_req:
            qsl = torch.cat([qsl, qsl[n_req:].expand(R - n_req)])
            seq = torch.cat([seq, seq.new_zeros(R - n_req)])
        table = cm.block_table_tensor[:n_req].to(torch.int32)
        if table.shape[0] < R:
            table = torch.nn.functional.pad(table, (0, 0, 0, R - table.shape[0]))
        return TpuPagedAttentionMetadata(num_actual_tokens=cm.num_actual_tokens, num_reqs=n_req,
                                         query_start_loc=qsl, seq_lens=seq, block_table=table)


class TpuPagedAttentionImpl(AttentionImpl[TpuPagedAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None, **kwargs) -> None:
        # A model's extra attention arguments change the result: refuse those not handled here
        # rather than drop them (a dropped `sinks` would silently change every token).
        unknown = sorted(k for k, v in kwargs.items() if v is not None)
        if unknown:
            raise NotImplementedError(f"torchtpu's vLLM attention: argument(s) {', '.join(unknown)} "
                                      "are not supported")
        if alibi_slopes is not None:
            raise NotImplementedError("torchtpu's vLLM attention: ALiBi is not supported yet")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"torchtpu's vLLM attention: attention type {attn_type} "
                                      "is not supported yet (decoder self-attention only)")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        assert self.num_heads % self.num_kv_heads == 0
        self.num_queries_per_kv = self.num_heads // self.num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or None
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"torchtpu's vLLM attention: sinks must have shape ({num_heads},), "
                             f"got {tuple(sinks.shape)}")
        # attention sinks (gpt-oss): one learned logit per head, in every softmax's denominator
        self.sinks = sinks

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        write_kv(kv_base(kv_cache), key, value, slot_mapping)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: TpuPagedAttentionMetadata | None,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torchtpu's vLLM attention: fused output quantization is not supported")
        if attn_metadata is None:  # profiling run without attention metadata
            return output.fill_(0)
        m = attn_metadata
        out = paged_attention(query, kv_base(kv_cache), m.query_start_loc, m.seq_lens, m.block_table,
                              self.scale, self.sliding_window or 0, self.logits_soft_cap or 0.0, self.sinks)
        output.copy_(out)
        return output


ensure_registered()
