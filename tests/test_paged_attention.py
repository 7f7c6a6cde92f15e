"""torchtpu::paged_attention and torchtpu.paged.write_kv (issue 35) against a float64 reference
written here, token by token: mixed prefill / chunked-prefill / decode batches, GQA, sliding
window, soft-cap, attention sinks, block tables with holes, contexts up to 4096 tokens; fp32 and
bf16; strict, debug and defer_and_fuse eager modes and torch.compile; one program per call
whose metadata are inputs (a new step with the same shapes compiles nothing)."""
from __future__ import annotations

import math

import pytest
import torch

import torchtpu
from torchtpu.paged import paged_attention, write_kv

DEV = "tpu"


def reference(q, cache, qsl, seq, bt, scale, window=0, cap=0.0, sinks=None):
    """float64, one query token at a time."""
    q, cache = q.double(), cache.double()
    T, H, D = q.shape
    NB, BS, Hkv, C = cache.shape
    G = H // Hkv
    out = torch.zeros(T, H, C - D, dtype=torch.float64)
    qsl, seq = qsl.tolist(), seq.tolist()
    for r in range(len(seq)):
        n, ql = seq[r], qsl[r + 1] - qsl[r]
        for i in range(ql):
            t, pos = qsl[r] + i, seq[r] - ql + i
            keys = [p for p in range(n) if p <= pos and (not window or p > pos - window)]
            kv = torch.stack([cache[int(bt[r, p // BS]), p % BS] for p in keys])  # [n, Hkv, C]
            for h in range(H):
                s = kv[:, h // G, :D] @ q[t, h] * scale
                if cap:
                    s = torch.tanh(s / cap) * cap
                if sinks is not None:
                    s = torch.cat([s, sinks[h].double().view(1)])
                p = torch.softmax(s, 0)[: len(keys)]
                out[t, h] = p @ kv[:, h // G, D:]
    return out


def make_batch(reqs, *, H=4, Hkv=2, D=8, Dv=None, BS=4, NB=None, T_pad=None, R_pad=None, W=None,
               dtype=torch.float32, seed=0):
    """reqs: [(seq_len, query_len)]. Blocks are a random permutation (block 0 reserved), table
    entries past each request's blocks are holes (-1 or stale ids)."""
    g = torch.Generator().manual_seed(seed)
    Dv = Dv or D
    need = [-(-n // BS) for n, _ in reqs]
    NB = NB or sum(need) + 8
    W = W or max(need + [1])
    R = R_pad or len(reqs)
    perm = (torch.randperm(NB - 1, generator=g) + 1).tolist()
    bt = torch.randint(0, NB, (R, W), generator=g, dtype=torch.int32)  # stale ids
    bt[:, W // 2:] = -1                                                   # and holes
    for r, k in enumerate(need):
        bt[r, :k] = torch.tensor(perm[:k], dtype=torch.int32)
        perm = perm[k:]
    seq = torch.zeros(R, dtype=torch.int32)
    seq[: len(reqs)] = torch.tensor([n for n, _ in reqs], dtype=torch.int32)
    ql = torch.zeros(R, dtype=torch.int64)
    ql[: len(reqs)] = torch.tensor([q for _, q in reqs])
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), ql.cumsum(0)]).to(torch.int32)
    T = T_pad or int(ql.sum())
    q = torch.randn(T, H, D, generator=g).to(dtype)
    cache = torch.randn(NB, BS, Hkv, D + Dv, generator=g).to(dtype)
    return q, cache, qsl, seq, bt


def on_tpu(*ts):
    return [t.to(DEV) if t is not None else None for t in ts]


MIXED = [(9, 9), (17, 1), (30, 6), (1, 1), (5, 2)]  # prefill, decode, chunked prefill with prefix, ...


@pytest.mark.parametrize("case", ["plain", "gqa4", "mha", "window", "softcap", "sinks", "all", "dv"])
def test_matches_float64_reference(case):
    kw = dict(H=4, Hkv=2)
    opts = {}
    if case == "gqa4":
        kw = dict(H=8, Hkv=2)
    if case == "mha":
        kw = dict(H=3, Hkv=3)
    if case == "dv":
        kw = dict(H=4, Hkv=2, D=8, Dv=4)
    if case in ("window", "all"):
        opts["window"] = 5
    if case in ("softcap", "all"):
        opts["cap"] = 1.5
    if case in ("sinks", "all"):
        opts["sinks"] = torch.randn(kw["H"])
    q, cache, qsl, seq, bt = make_batch(MIXED, T_pad=24, R_pad=8, **kw)
    scale = 1 / math.sqrt(q.shape[-1])
    want = reference(q, cache, qsl, seq, bt, scale, **opts)
    got = paged_attention(*on_tpu(q, cache, qsl, seq, bt), scale, opts.get("window", 0), opts.get("cap", 0.0),
                          *on_tpu(opts.get("sinks"))).cpu()
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
    assert got[int(qsl[-1]):].abs().max() == 0  # padding rows
    # the reference torchtpu runs off tpu (CPU; CUDA the same) agrees too
    cpu = paged_attention(q, cache, qsl, seq, bt, scale, opts.get("window", 0), opts.get("cap", 0.0),
                          opts.get("sinks"))
    torch.testing.assert_close(cpu.double(), want, atol=2e-5, rtol=2e-5)


def test_bf16():
    q, cache, qsl, seq, bt = make_batch(MIXED, T_pad=20, R_pad=6, dtype=torch.bfloat16)
    want = reference(q, cache, qsl, seq, bt, 0.35, window=7)
    got = paged_attention(*on_tpu(q, cache, qsl, seq, bt), 0.35, 7).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)


def test_long_context_many_blocks():
    """4096-token contexts in a cache of thousands of blocks: decode rows and a prefill chunk."""
    reqs = [(4096, 1), (4096, 16), (1000, 1), (2500, 3)]
    q, cache, qsl, seq, bt = make_batch(reqs, BS=16, H=2, Hkv=1, D=16, NB=2048, R_pad=4, seed=3)
    scale = 0.25
    want = reference(q, cache, qsl, seq, bt, scale, window=0)
    got = paged_attention(*on_tpu(q, cache, qsl, seq, bt), scale).cpu()
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    want_w = reference(q, cache, qsl, seq, bt, scale, window=600)
    got_w = paged_attention(*on_tpu(q, cache, qsl, seq, bt), scale, 600).cpu()
    torch.testing.assert_close(got_w.double(), want_w, atol=1e-4, rtol=1e-4)


def test_query_tiles():
    """More than 64 query rows: the op works through tiles of rows (the last one partial), each
    reading only the KV chunks its rows need: a 100-token prefill chunk over a cached prefix,
    decodes, another chunk, and padding rows."""
    reqs = [(150, 100), (40, 1), (300, 20), (7, 7), (90, 1)]
    q, cache, qsl, seq, bt = make_batch(reqs, T_pad=200, R_pad=8, BS=8, seed=7)
    sinks = torch.randn(4)
    for opts in ({}, dict(window=33, sinks=sinks)):
        want = reference(q, cache, qsl, seq, bt, 0.3, **opts)
        got = paged_attention(*on_tpu(q, cache, qsl, seq, bt), 0.3, opts.get("window", 0), 0.0,
                              *on_tpu(opts.get("sinks"))).cpu()
        torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)
        assert got[int(qsl[-1]):].abs().max() == 0


@pytest.mark.parametrize("mode", ["strict", "debug", "defer_and_fuse"])
def test_eager_modes(mode):
    q, cache, qsl, seq, bt = make_batch(MIXED, T_pad=24, R_pad=8, seed=1)
    sinks = torch.randn(4)
    want = reference(q, cache, qsl, seq, bt, 0.3, window=6, cap=2.0, sinks=sinks)
    with torchtpu.mode(mode):
        args = on_tpu(q, cache, qsl, seq, bt, sinks)
        got = paged_attention(*args[:5], 0.3, 6, 2.0, args[5]).cpu()
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5)


def test_inside_torch_compile():
    def layer(x, w, cache, qsl, seq, bt):
        qh = (x @ w).view(x.shape[0], 4, 8)
        return paged_attention(qh, cache, qsl, seq, bt, 0.3, 0, 0.0).sum(-1) + 1

    q, cache, qsl, seq, bt = make_batch(MIXED, T_pad=24, R_pad=8, NB=64, W=12, seed=2)
    x, w = torch.randn(24, 16), torch.randn(16, 32)
    want = reference((x @ w).view(24, 4, 8), cache, qsl, seq, bt, 0.3).sum(-1) + 1
    fn = torch.compile(layer, backend="tpu", fullgraph=True)
    got = fn(*on_tpu(x, w, cache, qsl, seq, bt)).cpu()
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    # a new step's metadata, same shapes: the same compiled graph, right answer
    q2, cache2, qsl2, seq2, bt2 = make_batch([(3, 3), (40, 1), (12, 8)], T_pad=24, R_pad=8, NB=cache.shape[0],
                                             W=bt.shape[1], seed=5)
    torchtpu.reset_metrics()
    got2 = fn(*on_tpu(x, w, cache2, qsl2, seq2, bt2)).cpu()
    assert torchtpu.metrics()["cache_misses"] == 0
    want2 = reference((x @ w).view(24, 4, 8), cache2, qsl2, seq2, bt2, 0.3).sum(-1) + 1
    torch.testing.assert_close(got2.double(), want2, atol=1e-4, rtol=1e-4)


def test_one_program_per_call_and_metadata_are_inputs():
    q, cache, qsl, seq, bt = make_batch(MIXED, T_pad=16, R_pad=8, NB=64, W=12, seed=4)
    args = on_tpu(q, cache, qsl, seq, bt)
    paged_attention(*args, 0.3).cpu()
    paged_attention(*args, 0.3).cpu()
    # another step: other lengths, other requests, other blocks; same padded shapes
    q2, cache2, qsl2, seq2, bt2 = make_batch([(44, 1), (2, 2), (7, 7)], T_pad=16, R_pad=8, NB=64, W=12, seed=6)
    args2 = on_tpu(q2, cache2, qsl2, seq2, bt2)
    torch.tpu.synchronize()
    torchtpu.reset_metrics()
    got = paged_attention(*args2, 0.3)
    torch.tpu.synchronize()
    m = torchtpu.metrics()
    assert m["cache_misses"] == 0 and m["executions"] == 1
    torch.testing.assert_close(got.cpu().double(), reference(q2, cache2, qsl2, seq2, bt2, 0.3), atol=2e-5, rtol=2e-5)


def test_write_kv_in_place_and_padding_slots():
    NB, BS, Hkv, D = 6, 4, 2, 3
    cache = torch.zeros(NB, BS, Hkv, 2 * D)
    k, v = torch.randn(5, Hkv, D), torch.randn(5, Hkv, D)
    slots = torch.tensor([7, 12, -1, 23, 4])
    tc = cache.to(DEV)
    view = tc[1]  # a view: sees the write
    write_kv(tc, *on_tpu(k, v, slots))
    want = cache.clone().view(NB * BS, Hkv, 2 * D)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want[s] = torch.cat([k[i], v[i]], -1)
    got = tc.cpu().view(NB * BS, Hkv, 2 * D)
    torch.testing.assert_close(got[BS:], want[BS:])  # block 0 is the null block padding writes into
    torch.testing.assert_close(view.cpu(), want.view(NB, BS, Hkv, 2 * D)[1])
    # and what paged_attention then reads
    bt = torch.tensor([[1, 3, 5, 0]], dtype=torch.int32)
    q = torch.randn(1, 4, D)
    meta = on_tpu(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([12], dtype=torch.int32), bt)
    out = paged_attention(q.to(DEV), tc, *meta, 0.5).cpu()
    torch.testing.assert_close(out.double(), reference(q, got.view(NB, BS, Hkv, 2 * D), torch.tensor([0, 1]),
                                                       torch.tensor([12]), bt, 0.5), atol=2e-5, rtol=2e-5)


def test_bad_input_names_the_op():
    q, cache, qsl, seq, bt = on_tpu(*make_batch([(5, 5)]))
    with pytest.raises(TypeError, match="paged_attention: seq_lens must be int32 or int64"):
        paged_attention(q, cache, qsl, seq.float(), bt, 1.0)
    with pytest.raises(ValueError, match="paged_attention: query_start_loc"):
        paged_attention(q, cache, qsl[:1], seq, bt, 1.0)
    with pytest.raises(ValueError, match="multiple of the cache's kv heads"):
        paged_attention(q[:, :3], cache, qsl, seq, bt, 1.0)
    with pytest.raises(TypeError, match="one floating dtype"):
        paged_attention(q.bfloat16(), cache, qsl, seq, bt, 1.0)
    with pytest.raises(RuntimeError, match="one device"):
        paged_attention(q, cache, qsl.cpu(), seq, bt, 1.0)
