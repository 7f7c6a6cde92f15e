"""torchtpu.quant: quantize/dequantize helpers (bits as torchao's layouts,
and the same on tpu as on CPU) and block-scaled matmuls against a plain CPU
PyTorch reference (dequantize in f32, matmul)."""
import pytest
import torch

import torchtpu
from torchtpu import quant as Q

FP4, E4, E5, E8 = torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def ref_fp4(packed):
    """(R, K/2) packed e2m1 -> (R, K) f32; element 2i in the low nibble."""
    u = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([u & 15, u >> 4], -1).flatten(-2)
    mag = _E2M1[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def ref_dequant(q, s, block):
    v = ref_fp4(q) if q.dtype == FP4 else q.float()
    return v * s.float().repeat_interleave(block, dim=-1)


def data(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[-1])
    x[0, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.0])  # e2m1 ties
    return x


def same_bits(a, b):
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


@pytest.mark.parametrize("elem", [FP4, E4], ids=str)
def test_quantize_mx_tpu_equals_cpu_and_roundtrips(elem):
    x = data((16, 128))
    q, s = Q.quantize_mx(x, elem)
    assert q.dtype == elem and s.dtype == E8 and s.shape == (16, 4)
    assert q.shape == ((16, 64) if elem == FP4 else (16, 128))
    qt, st = Q.quantize_mx(x.to("tpu"), elem)
    assert same_bits(qt, q) and same_bits(st, s)
    # dequantized values: the reference decode; error within the element format's step
    deq = Q.dequantize_mx(qt, st).cpu()
    assert torch.equal(deq, ref_dequant(q, s, 32))
    xb = x.view(16, 4, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    rel = ((deq.view(16, 4, 32) - xb).abs() / amax).max()
    assert rel <= (0.25 if elem == FP4 else 2 ** -3)


def test_quantize_nvfp4_tpu_equals_cpu():
    x = data((8, 64), 1)
    for g in (None, Q.nvfp4_global_scale(x)):
        q, s = Q.quantize_nvfp4(x, g)
        assert q.dtype == FP4 and s.dtype == E4 and s.shape == (8, 4)
        qt, st = Q.quantize_nvfp4(x.to("tpu"), None if g is None else g.to("tpu"))
        assert same_bits(qt, q) and same_bits(st, s)
        deq = Q.dequantize_nvfp4(qt, st, None if g is None else g.to("tpu")).cpu()
        want = ref_dequant(q, s, 16) * (1.0 if g is None else g)
        torch.testing.assert_close(deq, want, rtol=0, atol=0)


def test_quantize_fp8():
    x = data((8, 32), 2)
    for rowwise in (False, True):
        q, s = Q.quantize_fp8(x, rowwise=rowwise)
        qt, st = Q.quantize_fp8(x.to("tpu"), rowwise=rowwise)
        assert same_bits(qt, q) and torch.equal(st.cpu(), s)
        assert s.shape == ((8, 1) if rowwise else ())
        amax = x.abs().amax(-1, keepdim=True) if rowwise else x.abs().amax()
        assert ((q.float() * s - x).abs() <= amax * 2 ** -3).all()


def test_layouts_match_torchao():
    ao = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    x = data((32, 128), 3)
    for elem in (FP4, E4):
        s_ao, q_ao = ao.to_mx(x, elem, 32)
        q, s = Q.quantize_mx(x.to("tpu"), elem)
        assert same_bits(q, q_ao) and same_bits(s, s_ao)
    s_ao, q_ao = nv.nvfp4_quantize(x)
    q, s = Q.quantize_nvfp4(x.to("tpu"))
    assert same_bits(q, q_ao) and same_bits(s, s_ao)
    g = nv.per_tensor_amax_to_scale(x.abs().amax())
    s_ao, q_ao = nv.nvfp4_quantize(x, per_tensor_scale=g)
    q, s = Q.quantize_nvfp4(x.to("tpu"), Q.nvfp4_global_scale(x.to("tpu")))
    assert same_bits(q, q_ao) and same_bits(s, s_ao)
    f8 = pytest.importorskip("torchao.float8.float8_utils")
    scale = f8.tensor_to_scale(x, E4)
    q_ao = f8.to_fp8_saturated(x * scale, E4)
    q, s = Q.quantize_fp8(x.to("tpu"))
    assert same_bits(q, q_ao) and torch.equal(s.cpu(), scale.reciprocal())


@pytest.mark.parametrize("elem", [FP4, E4, E5], ids=str)
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=str)
def test_mx_matmul(elem, out):
    M, N, K = 12, 40, 96
    qa, sa = Q.quantize_mx(data((M, K), 4), elem)
    qb, sb = Q.quantize_mx(data((N, K), 5), elem)
    want = ref_dequant(qa, sa, 32) @ ref_dequant(qb, sb, 32).T
    torchtpu.reset_metrics()
    got = Q.mx_matmul(*[t.to("tpu") for t in (qa, sa, qb, sb)], out_dtype=out).cpu()
    assert got.dtype == out and got.shape == (M, N)
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    tol = dict(rtol=2e-5, atol=1e-3) if out == torch.float32 else dict(rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(got.float(), want.to(out).float(), **tol)


def test_nvfp4_matmul():
    M, N, K = 8, 24, 64
    xa, xb = data((M, K), 6), data((N, K), 7)
    ga, gb = Q.nvfp4_global_scale(xa), Q.nvfp4_global_scale(xb)
    qa, sa = Q.quantize_nvfp4(xa, ga)
    qb, sb = Q.quantize_nvfp4(xb, gb)
    want = (ref_dequant(qa, sa, 16) @ ref_dequant(qb, sb, 16).T) * (ga * gb)
    got = Q.nvfp4_matmul(*[t.to("tpu") for t in (qa, sa, qb, sb)], (ga * gb).to("tpu"),
                         out_dtype=torch.float32).cpu()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-3)


def test_block_matmul_bad_input():
    qa, sa = [t.to("tpu") for t in Q.quantize_mx(data((4, 64)))]
    qb, sb = [t.to("tpu") for t in Q.quantize_mx(data((8, 64), 1))]
    with pytest.raises(ValueError, match="b_scale must have shape"):
        Q.mx_matmul(qa, sa, qb, sb[:, :1])
    with pytest.raises(ValueError, match="a_scale must be torch.float8_e8m0fnu"):
        Q.mx_matmul(qa, sa.float(), qb, sb)
    with pytest.raises(ValueError, match="differ in K"):
        Q.mx_matmul(qa, sa, qb[:, :16], sb)
    with pytest.raises(ValueError, match="must both be"):
        Q.mx_matmul(qa, sa, qb.view(torch.uint8), sb)
    with pytest.raises(ValueError, match="not a multiple of the block size 16"):
        Q.nvfp4_matmul(qa[:, :4], sa[:, :1].float().to(E4), qb[:, :4], sb[:, :1].float().to(E4))
    with pytest.raises(ValueError, match="multiple of block_size"):
        Q.quantize_mx(torch.randn(4, 48, device="tpu"))
    # the op itself (no Python checks) names the argument too
    with pytest.raises(RuntimeError, match="b_scale must have shape"):
        torch.ops.torchtpu.block_scaled_mm(qa, sa, qb, sb[:, :1], None, 32, torch.float32)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_quant_linear(fmt):
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32).bfloat16()
    x = torch.randn(2, 3, 64).bfloat16()
    bias = lin.bias.detach().clone()  # QuantLinear shares lin's bias, which .to("tpu") moves (as on CUDA)
    ql = Q.QuantLinear(lin, fmt).to("tpu")
    w = ql.weight.cpu()
    assert w.dtype == (E4 if fmt == "fp8" else FP4)
    ws = ql.weight_scale.cpu()
    x2 = x.reshape(6, 64).float()
    if fmt == "fp8":  # dynamic row-wise activation quantization, then the scaled product
        amax = x2.abs().amax(-1, keepdim=True)
        s = 448.0 / amax
        xq = (x2 * s).clamp(-448, 448).to(E4)
        want = (xq.float() / s) @ (w.float() * ws).T
    else:
        want = x2.bfloat16().float() @ ref_dequant(w, ws, 32).bfloat16().float().T
    want = (want + bias.float()).reshape(2, 3, 32)
    got = ql(x.to("tpu")).cpu()
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 32)
    torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=2e-2)


@pytest.mark.slow
def test_torchao_float8_training_matches_cpu():
    """torchao's convert_to_float8_training (tensor-wise fp8 _scaled_mm in
    forward and backward) trains a tiny MLP on tpu as on CPU."""
    import copy

    fp8_train = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    x, y = torch.randn(16, 64), torch.randn(16, 32)
    runs = {}
    for dev in ("cpu", "tpu"):
        m = fp8_train.convert_to_float8_training(copy.deepcopy(mlp)).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torchtpu.reset_metrics()
        losses = []
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(m(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        if dev == "tpu":
            assert torchtpu.metrics()["cpu_fallbacks"] == {}
            assert torchtpu.metrics()["native_ops"].get("aten::_scaled_mm", 0) >= 9
        runs[dev] = losses, [p.detach().cpu() for p in m.parameters()]
    torch.testing.assert_close(runs["tpu"][0], runs["cpu"][0], rtol=1e-5, atol=0)
    for a, b in zip(*(runs[d][1] for d in ("tpu", "cpu"))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _fp8_blocks(w, bn=128, bk=128):
    """(..., N, K) -> float8 weight and (..., ceil(N/bn), ceil(K/bk)) f32 block scales (partial blocks at the ends)."""
    *lead, N, K = w.shape
    gn, gk = -(-N // bn), -(-K // bk)
    pad = torch.zeros(*lead, gn * bn, gk * bk)
    pad[..., :N, :K] = w
    s = (pad.unflatten(-1, (gk, bk)).unflatten(-3, (gn, bn)).abs().amax((-3, -1)) / 448).clamp(min=1e-12)
    full = s.repeat_interleave(bn, -2)[..., :N, :].repeat_interleave(bk, -1)[..., :K]
    return (w / full).to(E4), s, full


@pytest.mark.parametrize("T", [1, 6])  # 2 (token, expert) pairs < 4 experts: gathered; 12: grouped
def test_packed_fp8_experts(T):
    E, H, I, k = 4, 160, 192, 2  # partial blocks: the gate's and the up's scale rows are concatenated
    g = torch.Generator().manual_seed(T)
    gate_q, gate_s, gate_f = _fp8_blocks(torch.randn(E, I, H, generator=g) * 0.1)
    up_q, up_s, up_f = _fp8_blocks(torch.randn(E, I, H, generator=g) * 0.1)
    down_q, down_s, down_f = _fp8_blocks(torch.randn(E, H, I, generator=g) * 0.1)
    gate, up, down = gate_q.float() * gate_f, up_q.float() * up_f, down_q.float() * down_f

    def act(y):
        a, b = y.chunk(2, -1)
        return torch.nn.functional.silu(a) * b

    x = torch.randn(T, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    wts = torch.rand(T, k, generator=g).softmax(-1)
    want = torch.zeros(T, H)
    for t in range(T):
        for j in range(k):
            e = idx[t, j]
            h = act(x[t].float() @ torch.cat([gate[e], up[e]]).T)
            want[t] += wts[t, j] * (h @ down[e].T)
    args = (torch.cat([gate_q, up_q], 1), torch.cat([gate_s, up_s], 1), down_q, down_s, (128, 128), act)
    cpu = Q.PackedFP8Experts(*args)
    torch.testing.assert_close(cpu.weights("up", dtype=torch.float32), torch.cat([gate, up], 1))
    torchtpu.reset_metrics()
    tpu = Q.PackedFP8Experts(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
    got = tpu(x.to("tpu"), idx.to("tpu"), wts.to("tpu")).float().cpu()
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
    torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    torch.testing.assert_close(got, cpu(x, idx, wts).float(), rtol=0.01, atol=0.01 * want.abs().max().item())
