"""SGLang's paged attention on "tpu": torchtpu's one paged-attention op (torchtpu/paged.py), the
same op and KV layout the vLLM plugin uses.

KV pool (:class:`TpuMHATokenToKVPool`, SGLang's ``MHATokenToKVPool`` with its buffers carved
differently through the ``get_kv_pool_cls`` platform hook): one tensor per layer
``[slots, kv_heads, head_dim + v_head_dim]`` (keys then values along the last axis), viewed as
``[slots / page_size, page_size, kv_heads, head_dim + v_head_dim]`` -- torchtpu.paged's cache
layout. ``k_buffer``/``v_buffer`` are views of it, so the rest of SGLang's pool (addressing,
the radix cache, memory accounting) is unchanged. A write is :func:`torchtpu.paged.write_kv`:
one in-place scatter.

Attention backend (:class:`TpuPagedAttnBackend`, registered as ``torchtpu_paged`` in SGLang's
attention registry): per forward batch, ``query_start_loc [R+1]``, ``seq_lens [R]`` and block
tables ``[R, W]`` (SGLang's ``req_to_token`` rows, per page) with R the batch padded to a power
of two and W the pool's fixed context width, so one program serves every step of a bucket.
Prefill, extend over a cached (radix) prefix, mixed and decode batches are all one call of the
ragged op; GQA, sliding window, logit soft-cap and attention sinks are the op's.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import torch

import torchtpu

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
from torchtpu.paged import paged_attention, step_metadata, write_kv

BACKEND_NAME = "torchtpu_paged"
_MIN_ROWS = 8


def register_backend() -> None:
    """Adds ``torchtpu_paged`` to SGLang's attention registry and ``--attention-backend`` choices
    (both public: attention_registry.register_attention_backend, choices.add_attention_backend_choices).
    Idempotent."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in choices.ATTENTION_BACKEND_CHOICES:
        choices.add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(TpuPagedAttnBackend)


def padded_rows(batch_size: int) -> int:
    """The request rows of a step's metadata: the batch size rounded up to a power of two (at
    least 8), so steps of nearby sizes share one attention program."""
    r = _MIN_ROWS
    while r < batch_size:
        r *= 2
    return r


class TpuMHATokenToKVPool(MHATokenToKVPool):
    """SGLang's MHA token pool with torchtpu.paged's layout: keys and values of one layer side by
    side in one tensor (see the module docstring)."""

    def _create_buffers_normal(self):
        if getattr(self, "use_hnd", False) or getattr(self, "kv_cache_layout", "nhd") not in (None, "nhd"):
            raise NotImplementedError("torchtpu's SGLang KV pool: only the NHD layout is supported "
                                      "(unset SGLANG_USE_HND_KVCACHE)")
        p = self.page_size
        rows = -(-(self.size + p) // p) * p  # slot 0's page absorbs padded tokens' writes
        self.kv_buffer = [torch.zeros((rows, self.head_num, self.head_dim + self.v_head_dim),
                                      dtype=self.store_dtype, device=self.device)
                          for _ in range(self.layer_num)]
        self.k_buffer = [b[..., : self.head_dim] for b in self.kv_buffer]
        self.v_buffer = [b[..., self.head_dim:] for b in self.kv_buffer]

    def paged_cache(self, layer_id: int) -> torch.Tensor:
        """Layer ``layer_id``'s cache as ``[pages, page_size, kv_heads, head_dim + v_head_dim]``."""
        return self._paged(layer_id - self.start_layer)

    def _paged(self, layer_idx: int) -> torch.Tensor:
        b = self.kv_buffer[layer_idx]
        return b.view(b.shape[0] // self.page_size, self.page_size, b.shape[1], b.shape[2])

    def _store_kv_layer(self, layer_idx: int, loc: torch.Tensor, cache_k: torch.Tensor,
                        cache_v: torch.Tensor):
        write_kv(self._paged(layer_idx), cache_k.view(-1, self.head_num, self.head_dim),
                 cache_v.view(-1, self.head_num, self.v_head_dim), loc)


# TORCHTPU_SGLANG_STEP_LOG=<file>: each forward of each model process appends one JSON line --
# its mode, batch size, and torchtpu's counters (device programs run, compiles, CPU fallbacks)
# as the forward starts. The difference of two consecutive lines is one step's device work
# (docs/sglang.md "Programs per step").
_STEP_LOG = os.environ.get("TORCHTPU_SGLANG_STEP_LOG")


def _log_step(fb) -> None:
    m = torchtpu.metrics()
    line = json.dumps({"pid": os.getpid(), "mode": fb.forward_mode.name, "bs": int(fb.batch_size),
                       "executions": m["executions"], "compiles": m["compiles"],
                       "cpu_fallbacks": m["cpu_fallbacks"]})
    with open(_STEP_LOG, "a") as f:
        f.write(line + "\n")


@dataclass
class TpuPagedMetadata:
    query_start_loc: torch.Tensor  # [R+1] int32; padding requests repeat the last offset
    seq_lens: torch.Tensor         # [R] int32; padding requests: 0
    block_tables: torch.Tensor     # [R, W] int32 page ids


class TpuPagedAttnBackend(AttentionBackend):
    def __init__(self, model_runner):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.page_size = model_runner.page_size
        self.kv_index_translator = getattr(model_runner, "kv_index_translator", None)
        if not isinstance(self.token_to_kv_pool, TpuMHATokenToKVPool):
            raise NotImplementedError(
                f"torchtpu's SGLang attention needs torchtpu's KV pool (TpuMHATokenToKVPool), got "
                f"{type(self.token_to_kv_pool).__name__} (hybrid SWA / MLA / quantized pools are not supported)")
        self.forward_metadata = None

    # ------------------------------------------------------------ metadata
    def init_forward_metadata(self, forward_batch):
        if _STEP_LOG:
            _log_step(forward_batch)
        self.forward_metadata = self.build_metadata(forward_batch, padded_rows(forward_batch.batch_size))

    def build_metadata(self, fb, rows: int) -> TpuPagedMetadata:
        mode = fb.forward_mode
        bs = fb.batch_size
        if not (mode.is_decode_or_idle() or mode.is_extend() or mode.is_mixed()):
            raise NotImplementedError(f"torchtpu's SGLang attention: forward mode {mode.name} is not supported")
        dec = mode.is_decode_or_idle()
        seq_cpu = fb.seq_lens_cpu
        ext_cpu = fb.extend_seq_lens_cpu
        if seq_cpu is not None and seq_cpu.device.type == "cpu" and (dec or ext_cpu is not None):
            # host metadata: one upload of query_start_loc | seq_lens
            q = np.ones(bs, dtype=np.int64) if dec else np.asarray(ext_cpu[:bs], dtype=np.int64)
            qsl, seq = step_metadata(np.concatenate([[0], np.cumsum(q)]), seq_cpu[:bs].numpy(), rows, self.device)
        else:
            q = (torch.ones(bs, dtype=torch.int32, device=self.device) if dec
                 else fb.extend_seq_lens[:bs].to(torch.int32))
            qsl = torch.nn.functional.pad(torch.cumsum(q, 0, dtype=torch.int32), (1, rows - bs), value=0)
            if rows > bs:
                qsl[bs + 1:] = qsl[bs]
            seq = torch.nn.functional.pad(fb.seq_lens[:bs].to(torch.int32), (0, rows - bs))
        idx = fb.req_pool_indices[:bs].to(torch.int64)
        if rows > bs:  # padding requests read row 0 of req_to_token (reserved), with length 0
            idx = torch.nn.functional.pad(idx, (0, rows - bs))
        table = self.req_to_token_pool.req_to_token.index_select(0, idx)
        if self.page_size > 1:
            table = table[:, :: self.page_size] // self.page_size
        return TpuPagedMetadata(qsl, seq, table.to(torch.int32))

    # ------------------------------------------------------------ forward
    def _attend(self, q, k, v, layer, forward_batch, save_kv_cache, kwargs):
        sinks = kwargs.pop("sinks", None)
        unknown = sorted(name for name, val in kwargs.items() if val is not None)
        if unknown:
            raise NotImplementedError(f"torchtpu's SGLang attention: argument(s) {', '.join(unknown)} "
                                      "are not supported")
        if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
            raise NotImplementedError("torchtpu's SGLang attention: only causal decoder self-attention "
                                      f"is supported (layer {layer.layer_id}: {layer.attn_type})")
        if layer.logit_cap and layer.logit_capping_method != "tanh":
            raise NotImplementedError(f"torchtpu's SGLang attention: logit capping method "
                                      f"{layer.logit_capping_method!r} is not supported (tanh is)")
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
        m = self.forward_metadata
        h, d, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        window = layer.sliding_window_size
        # SGLang's window is exclusive of the query (a key at distance <= window is seen);
        # torchtpu.paged's counts the keys seen, the query's own included
        window = window + 1 if window is not None and window > -1 else 0
        out = paged_attention(q.reshape(-1, h, d), self.token_to_kv_pool.paged_cache(layer.layer_id),
                              m.query_start_loc, m.seq_lens, m.block_tables, layer.scaling, window,
                              float(layer.logit_cap or 0.0), sinks)
        return out.reshape(-1, h * dv)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def support_triton(self):
        return False
