"""Paged attention for vLLM on "tpu", in plain torch ops (each runs natively on the device).

KV cache of one layer: a tensor ``[num_blocks, block_size, num_kv_heads, head_size + head_size_v]``
(keys then values along the last axis), handed to vLLM as its logical ``[B, H, N, C]`` view
(layout LBNHC). Token ``t`` of a request lives in slot ``block_table[t // block_size] * block_size
+ t % block_size`` of the flattened ``[num_blocks * block_size, H, C]`` view.

* write: ``index_copy_`` of the step's keys|values into their slots (``do_kv_cache_update``;
  vLLM calls it before ``forward``, ``forward_includes_kv_cache_update = False``);
* read: a batch of mixed prefill and decode requests is laid out request-major, padded to
  ``[R, Q]`` query rows and ``[R, S]`` key slots (R, Q and S rounded up to powers of two so few
  shapes recur); the keys of each request are gathered through its block table, and a mask
  gives causality (key position <= query position), the request's length and the sliding
  window. GQA groups the query heads of each KV head. Softmax in float32.

The metadata builder does the host-side index arithmetic once per step and KV-cache group.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from vllm.v1.attention.backend import (
    AttentionBackend,
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


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


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
    q_rows: int           # R (padded)
    q_len: int            # Q (padded)
    kv_len: int           # S (padded)
    q_index: torch.Tensor  # [R*Q] int64: row of the flat query per padded slot
    tok_src: torch.Tensor  # [T] int64: padded slot (r*Q + i) of each actual token
    kv_slots: torch.Tensor  # [R*S] int64: KV cache slot of key position j of request r
    allowed: torch.Tensor   # [R, 1, 1, Q, S] bool: causal
    q_pos: np.ndarray | None = None     # [R, Q] int64 host positions of the query slots
    _window_masks: dict = field(default_factory=dict)

    def mask(self, window: int | None) -> torch.Tensor:
        """``allowed`` for a layer with sliding window ``window`` (None: full attention). A model
        mixing sliding and full layers (Gemma2/3) may have them in one KV cache group, one
        builder; each layer's own window is applied here, built on the host once per step and
        window."""
        if window is None:
            return self.allowed
        m = self._window_masks.get(window)
        if m is None:
            key_pos = np.arange(self.kv_len, dtype=np.int64)
            ok = key_pos[None, None, :] > self.q_pos[:, :, None] - window
            m = self.allowed & torch.from_numpy(ok).to(self.allowed.device).view(self.allowed.shape)
            self._window_masks[window] = m
        return m


class TpuPagedAttentionMetadataBuilder(AttentionMetadataBuilder[TpuPagedAttentionMetadata]):
    reorder_batch_threshold: int | None = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        # The group spec's sliding_window is a KV-management hint: with the hybrid KV cache
        # manager off, vLLM merges sliding and full layers into one FullAttentionSpec carrying
        # the window (kv_cache_interface.py FullAttentionSpec.merge). Each layer applies its
        # own window (TpuPagedAttentionMetadata.mask); ``allowed`` is causal only.
        self._arange_bs = torch.arange(self.block_size, dtype=torch.int64, device=device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> TpuPagedAttentionMetadata:
        cm = common_attn_metadata
        n_req, n_tok = cm.num_reqs, cm.num_actual_tokens
        qsl = cm.query_start_loc_cpu[: n_req + 1].numpy().astype(np.int64)
        if cm.seq_lens_cpu_upper_bound is not None:  # exact without async spec decode (off here)
            seq = cm.seq_lens_cpu_upper_bound[:n_req].numpy().astype(np.int64)
        else:
            seq = cm.seq_lens[:n_req].cpu().numpy().astype(np.int64)
        qlens = qsl[1:] - qsl[:-1]
        bs = self.block_size
        rows, q_len = _pow2(n_req), _pow2(int(qlens.max()) if n_req else 1)
        table = cm.block_table_tensor
        n_blocks = min(_pow2(-(-int(seq.max() if n_req else 1) // bs)), table.shape[1])
        kv_len = n_blocks * bs

        tok_r = np.repeat(np.arange(n_req, dtype=np.int64), qlens)
        tok_i = np.arange(n_tok, dtype=np.int64) - qsl[tok_r]
        q_index = np.zeros((rows, q_len), dtype=np.int64)
        q_pos = np.zeros((rows, q_len), dtype=np.int64)  # padding rows attend key 0 only
        q_index[tok_r, tok_i] = np.arange(n_tok, dtype=np.int64)
        q_pos[tok_r, tok_i] = seq[tok_r] - qlens[tok_r] + tok_i
        tok_src = tok_r * q_len + tok_i
        row_idx = np.zeros(rows, dtype=np.int64)
        row_idx[:n_req] = np.arange(n_req)

        dev = self.device
        key_pos = np.arange(kv_len, dtype=np.int64)
        allowed = key_pos[None, None, :] <= q_pos[:, :, None]
        allowed_t = torch.from_numpy(allowed).to(dev).view(rows, 1, 1, q_len, kv_len)

        row_idx_t = torch.from_numpy(row_idx).to(dev)
        blocks = table.index_select(0, row_idx_t)[:, :n_blocks].to(torch.int64)
        kv_slots = (blocks.unsqueeze(-1) * bs + self._arange_bs).reshape(rows * kv_len)
        return TpuPagedAttentionMetadata(
            num_actual_tokens=n_tok, num_reqs=n_req, q_rows=rows, q_len=q_len, kv_len=kv_len,
            q_index=torch.from_numpy(q_index.reshape(-1)).to(dev),
            tok_src=torch.from_numpy(tok_src).to(dev),
            kv_slots=kv_slots, allowed=allowed_t, q_pos=q_pos)


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

    @staticmethod
    def _flat(kv_cache: torch.Tensor) -> torch.Tensor:
        """[B, H, N, C] (an LBNHC view of a [B, N, H, C] tensor) -> [B*N, H, C] view of the storage."""
        base = kv_cache.permute(0, 2, 1, 3)
        return base.view(base.shape[0] * base.shape[1], base.shape[2], base.shape[3])

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        n = slot_mapping.shape[0]
        flat = self._flat(kv_cache)
        # Padded tokens carry slot -1: send them to block 0, vLLM's null block (never read).
        slots = torch.where(slot_mapping >= 0, slot_mapping, 0).to(torch.int64)
        kv = torch.cat([key[:n], value[:n]], dim=-1).to(flat.dtype)
        flat.index_copy_(0, slots, kv)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: TpuPagedAttentionMetadata | None,
                output: torch.Tensor, output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torchtpu's vLLM attention: fused output quantization is not supported")
        if attn_metadata is None:  # profiling run without attention metadata
            return output.fill_(0)
        m = attn_metadata
        n_tok = m.num_actual_tokens
        rows, q_len, kv_len = m.q_rows, m.q_len, m.kv_len
        h, hkv, g, d = self.num_heads, self.num_kv_heads, self.num_queries_per_kv, self.head_size
        dv = output.shape[-1]

        q = query[:n_tok].index_select(0, m.q_index)                       # [R*Q, H, D]
        q = q.view(rows, q_len, hkv, g, d).permute(0, 2, 3, 1, 4)          # [R, Hkv, G, Q, D]
        kv = self._flat(kv_cache).index_select(0, m.kv_slots)              # [R*S, Hkv, D+Dv]
        kv = kv.view(rows, kv_len, hkv, kv.shape[-1]).permute(0, 2, 1, 3)  # [R, Hkv, S, D+Dv]
        k = kv[..., :d].unsqueeze(2)                                       # [R, Hkv, 1, S, D]
        v = kv[..., d:].unsqueeze(2)                                       # [R, Hkv, 1, S, Dv]

        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.scale  # [R, Hkv, G, Q, S]
        if self.logits_soft_cap is not None:
            scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
        scores = scores.masked_fill(~m.mask(self.sliding_window), float("-inf"))
        if self.sinks is not None:
            sink = self.sinks.float().view(1, hkv, g, 1, 1).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v.float())                               # [R, Hkv, G, Q, Dv]
        out = out.permute(0, 3, 1, 2, 4).reshape(rows * q_len, h, dv)       # [R*Q, H, Dv]
        output[:n_tok].copy_(out.index_select(0, m.tok_src).to(output.dtype))
        return output


ensure_registered()
