"""torchtpu's paged attention backend for vLLM (torchtpu/vllm/attention.py), without an engine:
KV write by slot mapping and attention for a mixed prefill + decode batch read through
scattered blocks, against a dense causal reference on CPU (GQA, sliding window, soft cap)."""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("vllm")
# Without vLLM installed, "import vllm" finds this very directory (tests/vllm, a namespace
# package once tests/ is on sys.path); a real vLLM has vllm.v1.
pytest.importorskip("vllm.v1.attention.backend", reason="vLLM is not installed (bash tools/install_vllm.sh)")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torchtpu  # noqa: E402,F401

from vllm.v1.attention.backend import CommonAttentionMetadata  # noqa: E402

from torchtpu.vllm.attention import (  # noqa: E402
    TpuPagedAttentionImpl,
    TpuPagedAttentionMetadataBuilder,
)


class _Spec:
    def __init__(self, block_size, sliding_window=None):
        self.block_size = block_size
        self.sliding_window = sliding_window


def _reference(q, k, v, scale, window, soft_cap, sinks=None):
    """q [L, H, D] (the last L positions), k/v [S, Hkv, D] (all positions): causal attention;
    sinks [H]: one extra logit per head in the softmax's denominator (gpt-oss)."""
    L, H, _ = q.shape
    S, Hkv, _ = k.shape
    g = H // Hkv
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = torch.einsum("lhd,shd->hls", q.double(), k.double()) * scale
    if soft_cap:
        s = torch.tanh(s / soft_cap) * soft_cap
    qpos = torch.arange(S - L, S)[:, None]
    kpos = torch.arange(S)[None, :]
    ok = kpos <= qpos
    if window:
        ok &= kpos > qpos - window
    s = s.masked_fill(~ok, float("-inf"))
    if sinks is not None:
        p = torch.softmax(torch.cat([s, sinks.double()[:, None, None].expand(H, L, 1)], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return torch.einsum("hls,shd->lhd", p, v.double()).float()


# group_window: the KV cache group's spec window. vLLM merges sliding and full layers of a
# hybrid model (Gemma2/3) into one FullAttentionSpec carrying the window when its hybrid KV
# cache manager is off; a full layer (window None) of that group must still attend to all keys.
@pytest.mark.parametrize("window,soft_cap,group_window,sinks",
                         [(None, None, None, False), (5, None, 5, False), (None, 30.0, None, False),
                          (None, None, 5, False), (5, None, None, False), (5, None, None, True)])
def test_mixed_batch_matches_dense(window, soft_cap, group_window, sinks):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    H, Hkv, D, bs, n_blocks = 4, 2, 8, 4, 32
    dev = torch.device("tpu")
    # (context already in the cache, new tokens this step): prefill, decode, chunked prefill, decode
    reqs = [(0, 7), (9, 1), (5, 6), (3, 1)]
    scale = D ** -0.5
    sink = torch.randn(H) * 2 if sinks else None
    impl = TpuPagedAttentionImpl(H, D, scale, num_kv_heads=Hkv, sliding_window=window,
                                 logits_soft_cap=soft_cap, sinks=None if sink is None else sink.to(dev))
    cache = torch.zeros(n_blocks, bs, Hkv, 2 * D)  # [B, N, H, C]: the runner's per-layer tensor
    kv_cache = cache.to(dev).permute(0, 2, 1, 3)  # the [B, H, N, C] view vLLM binds
    perm = rng.permutation(np.arange(1, n_blocks))  # block 0 is vLLM's null block
    max_blocks = 8
    table = np.zeros((len(reqs), max_blocks), dtype=np.int32)
    full_k, full_v, slots_ctx, slots_new = [], [], [], []
    used = 0
    for r, (ctx, new) in enumerate(reqs):
        total = ctx + new
        nb = -(-total // bs)
        table[r, :nb] = perm[used:used + nb]
        used += nb
        full_k.append(torch.randn(total, Hkv, D))
        full_v.append(torch.randn(total, Hkv, D))
        sl = [int(table[r, t // bs]) * bs + t % bs for t in range(total)]
        slots_ctx.append(sl[:ctx])
        slots_new.append(sl[ctx:])
    # the context was written by earlier steps
    for r, (ctx, _) in enumerate(reqs):
        if ctx:
            impl.do_kv_cache_update(None, full_k[r][:ctx].to(dev), full_v[r][:ctx].to(dev), kv_cache,
                                    torch.tensor(slots_ctx[r], device=dev))
    # this step: every request's new tokens, one flat batch (+2 padded tokens with slot -1)
    new_k = torch.cat([full_k[r][ctx:] for r, (ctx, _) in enumerate(reqs)])
    new_v = torch.cat([full_v[r][ctx:] for r, (ctx, _) in enumerate(reqs)])
    n_tok = new_k.shape[0]
    pad = 2
    slot_mapping = torch.tensor(sum(slots_new, []) + [-1] * pad)
    key = torch.cat([new_k, torch.randn(pad, Hkv, D)])
    value = torch.cat([new_v, torch.randn(pad, Hkv, D)])
    impl.do_kv_cache_update(None, key.to(dev), value.to(dev), kv_cache, slot_mapping.to(dev))

    qlens = [new for _, new in reqs]
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(qlens)]), dtype=torch.int32)
    seq = torch.tensor([ctx + new for ctx, new in reqs], dtype=torch.int32)
    cm = CommonAttentionMetadata(
        query_start_loc=qsl.to(dev), query_start_loc_cpu=qsl, seq_lens=seq.to(dev), num_reqs=len(reqs),
        num_actual_tokens=n_tok, max_query_len=max(qlens), max_seq_len=int(seq.max()),
        block_table_tensor=torch.from_numpy(table).to(dev), slot_mapping=slot_mapping[:n_tok].to(dev),
        seq_lens_cpu_upper_bound=seq)
    builder = TpuPagedAttentionMetadataBuilder(_Spec(bs, group_window), ["l0"], None, dev)
    meta = builder.build(0, cm)
    query = torch.randn(n_tok + pad, H, D)
    out = torch.full((n_tok + pad, H, D), float("nan"), device=dev)
    torchtpu.reset_metrics()
    impl.forward(None, query.to(dev), key.to(dev), value.to(dev), kv_cache, meta, out)
    got = out.cpu()
    assert torchtpu.metrics()["cpu_fallbacks"] == {}

    start = 0
    for r, (ctx, new) in enumerate(reqs):
        ref = _reference(query[start:start + new], full_k[r], full_v[r], scale, window, soft_cap, sink)
        torch.testing.assert_close(got[start:start + new], ref, rtol=1e-4, atol=1e-4)
        start += new
    # the cache holds every token's key|value at its slot; block 0 only took the padding
    flat = kv_cache.permute(0, 2, 1, 3).reshape(-1, Hkv, 2 * D).cpu()
    for r in range(len(reqs)):
        s = torch.tensor(slots_ctx[r] + slots_new[r])
        torch.testing.assert_close(flat[s], torch.cat([full_k[r], full_v[r]], -1))


def test_unknown_attention_arguments_are_refused():
    """A model's extra attention argument that the backend does not implement is refused by
    name, never dropped (vLLM passes them as keyword arguments to the impl)."""
    with pytest.raises(NotImplementedError, match="q_norm_eps"):
        TpuPagedAttentionImpl(4, 8, 0.3, num_kv_heads=2, q_norm_eps=1e-6)
    with pytest.raises(ValueError, match="sinks must have shape"):
        TpuPagedAttentionImpl(4, 8, 0.3, num_kv_heads=2, sinks=torch.zeros(2))


def test_one_token_kv_write():
    """A single-token step (batch-1 decode): the key|value lands in its slot and nothing else
    changes (a one-row index_copy_, in place since torchtpu's single-window scatter fix)."""
    H, Hkv, D, bs, n_blocks = 4, 2, 8, 4, 8
    dev = torch.device("tpu")
    impl = TpuPagedAttentionImpl(H, D, D ** -0.5, num_kv_heads=Hkv)
    kv_cache = torch.zeros(n_blocks, bs, Hkv, 2 * D).to(dev).permute(0, 2, 1, 3)
    k, v = torch.randn(1, Hkv, D), torch.randn(1, Hkv, D)
    slot = 3 * bs + 2
    impl.do_kv_cache_update(None, k.to(dev), v.to(dev), kv_cache, torch.tensor([slot], device=dev))
    got = kv_cache.permute(0, 2, 1, 3).cpu().reshape(n_blocks * bs, Hkv, 2 * D)
    expected = torch.zeros_like(got)
    expected[slot] = torch.cat([k, v], -1)[0]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
