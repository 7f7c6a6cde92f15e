"""aten::_flash_attention_forward / _flash_attention_backward on tpu (ops/attention.cpp).

Small inputs take the dense form; above 2^20 scores the tiled form (flash attention's loops):
every check here also runs with TORCHTPU_FLASH_TILE=3 (the tiled form at every size, 3-token
tiles: documents straddle tiles, windows skip tiles), and one size crosses the threshold.

The varlen form (packed documents, cumulative sequence lengths: what
torch.nn.attention.varlen.varlen_attn and torchtitan's "varlen" backend call)
and the padded 4-D form, checked against per-document softmax attention
computed with plain torch ops in float64 on CPU, forward and backward.
"""
import math
import os
import re
import subprocess
import sys

import pytest
import torch

DEV = "tpu"
FA = torch.ops.aten._flash_attention_forward
FB = torch.ops.aten._flash_attention_backward


def reference(q, k, v, cu_q, cu_k, causal, scale, window=(-1, -1)):
    """Per-document attention; q (Tq, Hq, D), k/v (Tk, Hk, D); GQA by repeating kv heads.

    Returns (out (Tq, Hq, Dv), lse (Hq, Tq)) in float64; rows with no key: 0 and +inf.
    """
    Tq, Hq, _ = q.shape
    g = Hq // k.shape[1]
    out = q.new_zeros(Tq, Hq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((Hq, Tq), math.inf, dtype=torch.float64)
    wl, wr = window
    if causal:
        wr = 0
    for i in range(len(cu_q) - 1):
        qs, qe, ks, ke = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if qe == qs:
            continue
        qq = q[qs:qe].double().transpose(0, 1)
        kk = k[ks:ke].double().repeat_interleave(g, 1).transpose(0, 1)
        vv = v[ks:ke].double().repeat_interleave(g, 1).transpose(0, 1)
        s = qq @ kk.transpose(-1, -2) * scale
        Lq, Lk = qe - qs, ke - ks
        # bottom-right aligned window: key j allowed for query i when
        # -wl <= j - (i + Lk - Lq) <= wr
        d = torch.arange(Lk)[None, :] - (torch.arange(Lq)[:, None] + Lk - Lq)
        allowed = torch.ones(Lq, Lk, dtype=torch.bool)
        if wr >= 0:
            allowed &= d <= wr
        if wl >= 0:
            allowed &= d >= -wl
        s = s.masked_fill(~allowed, -math.inf)
        l = torch.logsumexp(s, -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)
        out[qs:qe] = (p @ vv).transpose(0, 1)
        lse[:, qs:qe] = l
    return out, lse


def leaves(*ts, device):
    return [t.detach().clone().to(device).requires_grad_() for t in ts]


def check_varlen(lens_q, lens_k, hq, hk, d, dv, causal, scale, dtype, window=(-1, -1), atol=2e-5):
    g = torch.Generator().manual_seed(sum(lens_q) * 7 + hq + d)
    cu_q = [0]
    cu_k = [0]
    for a, b in zip(lens_q, lens_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    Tq, Tk = cu_q[-1], cu_k[-1]
    q = torch.randn(Tq, hq, d, generator=g).to(dtype)
    k = torch.randn(Tk, hk, d, generator=g).to(dtype)
    v = torch.randn(Tk, hk, dv, generator=g).to(dtype)
    go = torch.randn(Tq, hq, dv, generator=g).to(dtype)
    qc, kc, vc = leaves(q, k, v, device="cpu")
    ro, rl = reference(qc, kc, vc, cu_q, cu_k, causal, scale if scale is not None else d ** -0.5, window)
    (ro * go.double()).sum().backward()
    qd, kd, vd = leaves(q, k, v, device=DEV)
    cq = torch.tensor(cu_q, dtype=torch.int32, device=DEV)
    ck = torch.tensor(cu_k, dtype=torch.int32, device=DEV)
    o, lse, rng, unused, dbg = FA(qd, kd, vd, cq, ck, max(lens_q), max(lens_k), 0.0, causal, False,
                                  scale=scale, window_size_left=window[0], window_size_right=window[1])
    assert o.dtype == dtype and o.shape == (Tq, hq, dv)
    assert lse.dtype == torch.float32 and lse.shape == (hq, Tq)
    assert rng.shape == (2,) and rng.dtype == torch.uint64 and dbg.numel() == 0
    tol = dict(atol=atol, rtol=atol) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(o.cpu().double(), ro.detach().to(dtype).double(), **tol)
    torch.testing.assert_close(lse.cpu().double(), rl, **tol)
    (o * go.to(DEV)).sum().backward()
    for name, a, b in (("dq", qd, qc), ("dk", kd, kc), ("dv", vd, vc)):
        assert a.grad.dtype == dtype and a.grad.shape == b.shape, name
        torch.testing.assert_close(a.grad.cpu().double(), b.grad.to(dtype).double(), msg=name, **tol)


@pytest.mark.parametrize("causal", [True, False])
def test_varlen_packed_documents(causal):
    check_varlen([5, 4, 3], [5, 4, 3], 4, 4, 8, 8, causal, None, torch.float32)


def test_varlen_gqa_scale_and_value_dim():
    # 6 query heads sharing 2 kv heads; value head dim differs (as in MLA)
    check_varlen([7, 1, 4], [7, 1, 4], 6, 2, 8, 4, True, 0.3, torch.float32)


def test_varlen_cross_lengths_bottom_right_causal_and_empty_document():
    # q shorter than k per document (bottom-right causal), an empty q document
    check_varlen([2, 0, 3], [4, 2, 3], 2, 2, 4, 4, True, None, torch.float32)


def test_varlen_sliding_window():
    check_varlen([9, 6], [9, 6], 2, 1, 4, 4, False, None, torch.float32, window=(2, 0))


def test_varlen_bf16():
    check_varlen([8, 8], [8, 8], 4, 2, 16, 16, True, None, torch.bfloat16)


def test_varlen_attn_public_api_and_autograd():
    """torch.nn.attention.varlen.varlen_attn: the call torchtitan's VarlenAttention makes."""
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    g = torch.Generator().manual_seed(3)
    B, L, H, KV, D = 2, 8, 4, 2, 8
    q = torch.randn(B * L, H, D, generator=g).bfloat16()
    k = torch.randn(B * L, KV, D, generator=g).bfloat16()
    v = torch.randn(B * L, KV, D, generator=g).bfloat16()
    cu = [0, 3, 8, 11, 16]
    qd, kd, vd = leaves(q, k, v, device=DEV)
    cud = torch.tensor(cu, dtype=torch.int32, device=DEV)
    out, lse = varlen.varlen_attn(qd, kd, vd, cud, cud, 5, 5, window_size=(-1, 0), enable_gqa=True,
                                  return_aux=varlen.AuxRequest(lse=True))
    qc, kc, vc = leaves(q, k, v, device="cpu")
    ro, rl = reference(qc, kc, vc, cu, cu, True, D ** -0.5)
    torch.testing.assert_close(out.cpu().double(), ro.detach().bfloat16().double(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.cpu().double(), rl, atol=1e-2, rtol=1e-2)
    out.float().sum().backward()
    ro.sum().backward()
    for a, b in ((qd, qc), (kd, kc), (vd, vc)):
        torch.testing.assert_close(a.grad.cpu().double(), b.grad.bfloat16().double(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("causal", [True, False])
def test_padded_4d_form(causal):
    """(batch, seq, heads, dim) inputs without cum_seq: lse (batch, heads, seq)."""
    g = torch.Generator().manual_seed(5)
    B, L, H, D = 2, 6, 2, 8
    q, k, v = (torch.randn(B, L, H, D, generator=g) for _ in range(3))
    qd, kd, vd = leaves(q, k, v, device=DEV)
    o, lse, *_ = FA(qd, kd, vd, None, None, L, L, 0.0, causal, False)
    assert o.shape == (B, L, H, D) and lse.shape == (B, H, L)
    cpu_leaves = leaves(q, k, v, device="cpu")
    flat = [t.reshape(B * L, H, D) for t in cpu_leaves]
    cu = [i * L for i in range(B + 1)]
    ro, rl = reference(*flat, cu, cu, causal, D ** -0.5)
    torch.testing.assert_close(o.cpu().double(), ro.detach().view(B, L, H, D), atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.cpu().double(), rl.view(H, B, L).transpose(0, 1), atol=2e-5, rtol=2e-5)
    go = torch.randn(B, L, H, D, generator=g)
    # SDPA's flash path passes empty cum_seq tensors for this form
    dq, dk, dv = FB(go.to(DEV), qd, kd, vd, o, lse, torch.empty(0, device=DEV), torch.empty(0, device=DEV),
                    L, L, 0.0, causal, torch.zeros(2, dtype=torch.uint64, device=DEV),
                    torch.zeros((), dtype=torch.uint64, device=DEV))
    (ro * go.reshape(B * L, H, D).double()).sum().backward()
    for a, b in zip((dq, dk, dv), cpu_leaves):
        torch.testing.assert_close(a.cpu().double(), b.grad.double(), atol=2e-5, rtol=2e-5)


def test_unsupported_arguments_raise():
    q = torch.randn(4, 1, 4, device=DEV)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEV)
    with pytest.raises(Exception, match="dropout"):
        FA(q, q, q, cu, cu, 4, 4, 0.1, True, False)


@pytest.mark.skipif(os.environ.get("TORCHTPU_FLASH_TILE") is not None, reason="this run is the tiled one")
@pytest.mark.parametrize("tile", [3])
def test_every_check_in_the_tiled_form(tile):
    """This file again with the tiled form at every size (tiles of 3 or 8 tokens)."""
    env = dict(os.environ, TORCHTPU_FLASH_TILE=str(tile))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # pytest's summary: tests passed, none failed (other lines, e.g. the TPU check's, may say "0 failed")
    assert re.search(r"\b\d+ passed", r.stdout) and not re.search(r"\b[1-9]\d* failed", r.stdout)


def test_long_packed_batch_takes_the_tiled_form(tmp_path, monkeypatch):
    """2 heads x 6000 packed tokens (72M scores, far above the dense limit): the program loops
    (stablehlo.while) and holds no [Tq, Tk] tensor; results equal per-document attention."""
    if os.environ.get("TORCHTPU_FLASH_TILE") is None:
        monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))
    lens = [2500, 1700, 1800]
    cu = torch.tensor([0, 2500, 4200, 6000], dtype=torch.int32)
    g = torch.Generator().manual_seed(11)
    q, k, v, go = (torch.randn(6000, 2, 16, generator=g) for _ in range(4))
    qd, kd, vd = leaves(q, k, v, device=DEV)
    o, lse, *_ = FA(qd, kd, vd, cu.to(DEV), cu.to(DEV), max(lens), max(lens), 0.0, True, False)
    (o * go.to(DEV)).sum().backward()
    qc, kc, vc = leaves(q, k, v, device="cpu")
    outs = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):  # per document, CPU SDPA (float32)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qc[s:e].transpose(0, 1), kc[s:e].transpose(0, 1), vc[s:e].transpose(0, 1), is_causal=True).transpose(0, 1))
    ro = torch.cat(outs)
    (ro * go).sum().backward()
    torch.testing.assert_close(o.cpu(), ro.detach(), atol=1e-4, rtol=1e-4)
    for name, a, b in (("dq", qd, qc), ("dk", kd, kc), ("dv", vd, vc)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=1e-4, rtol=1e-4, msg=name)
    if os.environ.get("TORCHTPU_FLASH_TILE") is None:
        texts = [p.read_text() for p in tmp_path.iterdir()]
        attn = [t for t in texts if "stablehlo.while" in t]
        assert len(attn) >= 2  # forward and backward
        for t in texts:  # no tensor with both a query and a key axis
            for dims in re.findall(r"tensor<((?:\d+x)+)", t):
                assert sum(int(x) >= 6000 for x in dims.rstrip("x").split("x")) < 2, dims
