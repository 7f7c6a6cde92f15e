"""Paged attention and the paged KV cache: the one implementation behind every serving
integration (vLLM's attention backend, SGLang's), below all of them.

KV cache of one layer: ``[num_blocks, block_size, num_kv_heads, head_size + head_size_v]``,
keys then values along the last axis. Token ``t`` of a request lives in slot
``block_table[t // block_size] * block_size + t % block_size`` of the cache flattened to
``[num_blocks * block_size, num_kv_heads, head_size + head_size_v]``.

* :func:`write_kv` writes a step's keys and values into their slots, in place (one scatter
  into the cache's storage; padded tokens carry slot -1 and land in the null block 0);
* ``torch.ops.torchtpu.paged_attention`` (:func:`paged_attention`) is ragged attention over a
  batch of mixed prefill, chunked-prefill and decode requests, packed by ``query_start_loc``:
  causal within each request, GQA, sliding window, logit soft-cap, attention sinks, softmax in
  float32. On "tpu" it is one lowering (csrc/ops/attention.cpp) that reads the cache a chunk of
  blocks at a time in a device-side loop, so memory does not grow with the context and one
  compiled program serves every step with the same padded shapes. Every argument that changes
  from step to step is a tensor. Elsewhere (CPU, CUDA) it runs the reference below.
"""
from __future__ import annotations

import numpy as np
import torch

_lib = torch.library.Library("torchtpu", "FRAGMENT")
_lib.define(
    "paged_attention(Tensor query, Tensor kv_cache, Tensor query_start_loc, Tensor seq_lens, "
    "Tensor block_tables, float scale, int sliding_window=0, float soft_cap=0.0, Tensor? sinks=None) -> Tensor")


def _check(query, kv_cache, query_start_loc, seq_lens, block_tables, sinks):
    op = "torchtpu.paged_attention"
    if query.dim() != 3:
        raise ValueError(f"{op}: query must be 3-D (tokens, heads, head_size), got {tuple(query.shape)}")
    if kv_cache.dim() != 4:
        raise ValueError(f"{op}: kv_cache must be 4-D (blocks, block_size, kv_heads, head_size + "
                         f"head_size_v), got {tuple(kv_cache.shape)}")
    h, d = query.shape[1], query.shape[2]
    hkv, c = kv_cache.shape[2], kv_cache.shape[3]
    if hkv == 0 or h % hkv:
        raise ValueError(f"{op}: query heads ({h}) must be a multiple of the cache's kv heads ({hkv})")
    if c <= d:
        raise ValueError(f"{op}: kv_cache's last dimension ({c}) must hold head_size ({d}) keys and the values")
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("block_tables", block_tables)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")
    r = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if (query_start_loc.dim() != 1 or seq_lens.dim() != 1 or block_tables.dim() != 2
            or query_start_loc.shape[0] != r + 1 or block_tables.shape[0] != r):
        raise ValueError(f"{op}: query_start_loc [R+1], seq_lens [R] and block_tables [R, W] must agree on R; got "
                         f"{tuple(query_start_loc.shape)}, {tuple(seq_lens.shape)}, {tuple(block_tables.shape)}")
    if not query.dtype.is_floating_point or kv_cache.dtype != query.dtype:
        raise TypeError(f"{op}: query and kv_cache must have one floating dtype, got {query.dtype} and "
                        f"{kv_cache.dtype}")
    if sinks is not None and tuple(sinks.shape) != (h,):
        raise ValueError(f"{op}: sinks must have shape ({h},), got {tuple(sinks.shape)}")
    devs = {t.device for t in (query, kv_cache, query_start_loc, seq_lens, block_tables)
            if t is not None} | ({sinks.device} if sinks is not None else set())
    if len(devs) != 1:
        raise RuntimeError(f"{op}: expected all tensors on one device, got {sorted(map(str, devs))}")


@torch.library.register_fake("torchtpu::paged_attention")
def _paged_attention_fake(query, kv_cache, query_start_loc, seq_lens, block_tables, scale, sliding_window=0,
                          soft_cap=0.0, sinks=None):
    _check(query, kv_cache, query_start_loc, seq_lens, block_tables, sinks)
    dv = kv_cache.shape[3] - query.shape[2]
    return query.new_empty((query.shape[0], query.shape[1], dv))


def _paged_attention_reference(query, kv_cache, query_start_loc, seq_lens, block_tables, scale,
                               sliding_window=0, soft_cap=0.0, sinks=None):
    """Request by request, in float32 (float64 for float64 inputs), on any device."""
    _check(query, kv_cache, query_start_loc, seq_lens, block_tables, sinks)
    t, h, d = query.shape
    nb, bs, hkv, c = kv_cache.shape
    g = h // hkv
    ct = torch.float64 if query.dtype == torch.float64 else torch.float32
    out = torch.zeros((t, h, c - d), dtype=query.dtype, device=query.device)
    qsl, seq, table = query_start_loc.tolist(), seq_lens.tolist(), block_tables.to(torch.int64)
    flat = kv_cache.reshape(nb * bs, hkv, c)
    for r in range(len(seq)):
        q0, q1, n = qsl[r], qsl[r + 1], seq[r]
        if q1 <= q0:
            continue
        blocks = table[r, : -(-n // bs)]
        slots = (blocks[:, None] * bs + torch.arange(bs, device=query.device)).reshape(-1)[:n]
        kv = flat.index_select(0, slots).to(ct)                       # [n, Hkv, C]
        k, v = kv[..., :d], kv[..., d:]
        q = query[q0:q1].to(ct).view(q1 - q0, hkv, g, d)
        s = torch.einsum("qhgd,khd->hgqk", q, k) * scale               # [Hkv, G, q, n]
        if soft_cap:
            s = torch.tanh(s / soft_cap) * soft_cap
        qpos = torch.arange(n - (q1 - q0), n, device=query.device)[:, None]
        kpos = torch.arange(n, device=query.device)[None, :]
        see = kpos <= qpos
        if sliding_window:
            see = see & (kpos > qpos - sliding_window)
        s = s.masked_fill(~see, float("-inf"))
        if sinks is not None:
            sk = sinks.to(ct).view(hkv, g, 1, 1).expand(hkv, g, q1 - q0, 1)
            p = torch.softmax(torch.cat([s, sk], -1), -1)[..., :-1]
        else:
            p = torch.softmax(s, -1)
        o = torch.einsum("hgqk,khd->qhgd", p, v.to(ct))
        out[q0:q1] = o.reshape(q1 - q0, h, c - d).to(query.dtype)
    return out


for _key in ("CPU", "CUDA"):
    torch.library.impl("torchtpu::paged_attention", _key)(_paged_attention_reference)


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, sliding_window: int = 0,
                    soft_cap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Ragged paged attention: ``query [T, H, D]`` -> ``[T, H, Dv]`` (see the module docstring).

    ``query_start_loc [R+1]``, ``seq_lens [R]`` and ``block_tables [R, W]`` describe R requests
    (padding requests: no query rows, length 0); rows past ``query_start_loc[R]`` give zeros.
    ``sliding_window`` 0 means none; ``soft_cap`` 0 means none.
    """
    if query.device.type == "tpu":
        _check(query, kv_cache, query_start_loc, seq_lens, block_tables, sinks)
    return torch.ops.torchtpu.paged_attention(query, kv_cache, query_start_loc, seq_lens, block_tables,
                                              float(scale), int(sliding_window or 0), float(soft_cap or 0.0),
                                              sinks)


def step_metadata(query_start_loc, seq_lens, rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's ``query_start_loc [n+1]`` and ``seq_lens [n]`` (host arrays of n requests) padded to
    ``rows`` requests -- padding requests have no query rows (they repeat the last offset) and
    length 0 -- and uploaded to ``device`` in one transfer: ``(query_start_loc [rows+1], seq_lens
    [rows])`` as int32. A fixed ``rows`` keeps the attention program's shapes fixed from step to
    step (every serving integration builds its metadata with it)."""
    n = len(seq_lens)
    host = np.zeros(2 * rows + 1, dtype=np.int32)
    host[: n + 1] = query_start_loc
    host[n + 1: rows + 1] = host[n]
    host[rows + 1: rows + 1 + n] = seq_lens
    dev = torch.from_numpy(host).to(device)
    return dev[: rows + 1], dev[rows + 1:]


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Writes ``key [N, Hkv, D]`` and ``value [N, Hkv, Dv]`` into their slots of ``kv_cache``
    (``[blocks, block_size, Hkv, D + Dv]``, contiguous), in place: one scatter into its storage.
    Slots < 0 (padding tokens) write slot 0, which belongs to block 0: a reserved null block, as
    in vLLM and SGLang, never read as a request's key."""
    nb, bs, hkv, c = kv_cache.shape
    n = slot_mapping.shape[0]
    flat = kv_cache.view(nb * bs, hkv, c)
    slots = torch.where(slot_mapping >= 0, slot_mapping, 0).to(torch.int64)
    kv = torch.cat([key[:n], value[:n]], dim=-1).to(kv_cache.dtype)
    flat.index_copy_(0, slots, kv)
