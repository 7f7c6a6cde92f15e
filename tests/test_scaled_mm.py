"""torch._scaled_mm, torch._scaled_mm_v2 / F.scaled_mm on tpu against CPU's
_scaled_mm (tensor-wise, row-wise) and a plain CPU PyTorch reference
(dequantize in f32, matmul) for the block-scaled recipes CPU does not run."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu

ST, SW = F.ScalingType, F.SwizzleType
E4, E5, E8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu
FP4 = torch.float4_e2m1fn_x2
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def tpu(*ts):
    return [t.to("tpu") for t in ts]


def fp8(shape, dt=E4, seed=0, scale=8.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dt)


def col_major(b):  # (K, N) with column-major strides, as _scaled_mm wants
    return b.T.contiguous().T


def fp4_values(packed):
    """(R, K/2) float4_e2m1fn_x2 -> (R, K) f32, low nibble first (reference)."""
    u = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([u & 15, u >> 4], -1).flatten(-2)
    mag = _E2M1[codes & 7]
    return torch.where(codes >= 8, -mag, mag)


def swizzle(s):
    """(rows, cols) scales -> cuBLAS' blocked layout (128x4 tiles stored as
    32x16: within a tile, row r and column c go to (r % 32, (r // 32) * 4 + c))."""
    rows, cols = s.shape
    nr, nc = -(-rows // 128), -(-cols // 4)
    out = torch.zeros(nr * nc * 512, dtype=torch.uint8)
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(cols).view(1, -1)
    idx = ((r // 128) * nc + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    out[idx.flatten()] = s.view(torch.uint8).flatten()
    return out.view(s.dtype).view(nr * 128, nc * 4)


def close(got, want):
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype in (E4, E5):
        # one rounding of the f32 accumulation may move an fp8 result by one step
        d = (got.view(torch.uint8).int() - want.view(torch.uint8).int()).abs()
        assert d.max() <= 1 and (d > 0).float().mean() < 0.02
        return
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-4)
    else:  # f32 accumulations in another order may round to the neighbouring bf16/f16
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7,
                                   atol=2 ** -7 * want.float().abs().max().item())


@pytest.mark.parametrize("da,db", [(E4, E4), (E5, E4), (E5, E5)], ids=str)
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16, torch.float16, E4], ids=str)
def test_scaled_mm_tensorwise_vs_cpu(da, db, out):
    a, b = fp8((32, 64), da, 1), col_major(fp8((64, 48), db, 2))
    sa, sb = torch.tensor(0.37), torch.tensor(1.7)
    kw = dict(out_dtype=out)
    if out == E4:
        kw["scale_result"] = torch.tensor(40.0)
    want = torch._scaled_mm(a, b, sa, sb, **kw)
    kw = {k: (v.to("tpu") if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    close(torch._scaled_mm(*tpu(a, b, sa, sb), **kw), want)


@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=str)
def test_scaled_mm_rowwise_bias_vs_cpu(out):
    g = torch.Generator().manual_seed(3)
    a, b = fp8((32, 64), seed=4), col_major(fp8((64, 48), seed=5))
    sa, sb = torch.rand(32, 1, generator=g) + 0.1, torch.rand(1, 48, generator=g) + 0.1
    bias = torch.randn(48, generator=g).to(out)
    want = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=out)
    close(torch._scaled_mm(*tpu(a, b, sa, sb), bias=bias.to("tpu"), out_dtype=out), want)
    # torch.nn.functional.scaled_mm (-> _scaled_mm_v2)
    got = F.scaled_mm(*tpu(a, b), sa.to("tpu"), ST.RowWise, sb.to("tpu"), ST.RowWise,
                      bias=bias.to("tpu"), output_dtype=out)
    close(got, want)
    want_t = torch._scaled_mm(a, b, sa[0, 0], sb[0, 0], out_dtype=out)
    got_t = F.scaled_mm(*tpu(a, b), sa[0, 0].to("tpu"), ST.TensorWise, sb[0, 0].to("tpu"),
                        ST.TensorWise, output_dtype=out)
    close(got_t, want_t)


@pytest.mark.parametrize("M,K,N", [(48, 384, 256), (3, 128, 384), (200, 128, 256)])
def test_scaled_mm_blockwise_128(M, K, N):
    """DeepSeek-style fp8: 1x128 activation blocks, 128x128 weight blocks. K = 128 (one block
    along K) once took the per-row fast path with one scale per 128 rows (an XLA compile error)."""
    g = torch.Generator().manual_seed(6)
    a, b = fp8((M, K), seed=7), col_major(fp8((K, N), seed=8))
    sa = torch.rand(M, K // 128, generator=g) + 0.5
    sb = torch.rand(K // 128, N // 128, generator=g) + 0.5
    da = a.float() * sa.repeat_interleave(128, 1)
    db = b.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)
    want = (da @ db).to(torch.bfloat16)
    close(torch._scaled_mm(*tpu(a, b, sa, sb), out_dtype=torch.bfloat16), want)
    # 1x128 x 1x128 (v1 layout: scale_b (K/128, N))
    sb2 = torch.rand(K // 128, N, generator=g) + 0.5
    want2 = (da @ (b.float() * sb2.repeat_interleave(128, 0))).to(torch.bfloat16)
    close(torch._scaled_mm(*tpu(a, b, sa, sb2), out_dtype=torch.bfloat16), want2)
    # the same through F.scaled_mm's layouts (scale_b (N, K/128); 128x128 as (K/128 rounded to 4, N/128))
    # 128x128 blocks of a (v1: scale_a (ceil(M/128), K/128))
    sa3 = torch.rand(-(-M // 128), K // 128, generator=g) + 0.5
    da3 = a.float() * sa3.repeat_interleave(128, 0)[:M].repeat_interleave(128, 1)
    want3 = (da3 @ (b.float() * sb2.repeat_interleave(128, 0))).to(torch.bfloat16)
    close(torch._scaled_mm(*tpu(a, b, sa3, sb2), out_dtype=torch.bfloat16), want3)
    # (column-major scales, as torch checks)
    sa_cm = col_major(sa).to("tpu")
    got = F.scaled_mm(*tpu(a, b), sa_cm, ST.BlockWise1x128, sb2.T.to("tpu"),
                      ST.BlockWise1x128, output_dtype=torch.bfloat16)
    close(got, want2)
    sb_v2 = torch.zeros(4, N // 128)
    sb_v2[:K // 128] = sb
    got = F.scaled_mm(*tpu(a, b), sa_cm, ST.BlockWise1x128, col_major(sb_v2).to("tpu"),
                      ST.BlockWise128x128, output_dtype=torch.bfloat16)
    close(got, want)


def e8m0(shape, seed, lo=120, hi=134):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int32).to(torch.uint8).view(E8)


def fp4(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8).view(FP4)


@pytest.mark.parametrize("elem", ["fp4", "fp8"])
def test_scaled_mm_mx_swizzled(elem):
    M, N, K = 40, 160, 128
    if elem == "fp4":
        a, bt = fp4((M, K // 2), 9), fp4((N, K // 2), 10)
        va, vb = fp4_values(a), fp4_values(bt)
    else:
        a, bt = fp8((M, K), seed=9, scale=2.0), fp8((N, K), seed=10, scale=2.0)
        va, vb = a.float(), bt.float()
    sa, sb = e8m0((M, K // 32), 11), e8m0((N, K // 32), 12)
    ref = (va * sa.float().repeat_interleave(32, 1)) @ (vb * sb.float().repeat_interleave(32, 1)).T
    want = ref.to(torch.bfloat16)
    b = bt.T
    close(torch._scaled_mm(*tpu(a, b, swizzle(sa), swizzle(sb)), out_dtype=torch.bfloat16), want)
    got = F.scaled_mm(*tpu(a, b), swizzle(sa).to("tpu"), ST.BlockWise1x32, swizzle(sb).to("tpu"),
                      ST.BlockWise1x32, swizzle_a=SW.SWIZZLE_32_4_4, swizzle_b=SW.SWIZZLE_32_4_4,
                      output_dtype=torch.bfloat16)
    close(got, want)


def test_scaled_mm_nvfp4_two_level():
    M, N, K = 24, 144, 64
    a, bt = fp4((M, K // 2), 13), fp4((N, K // 2), 14)
    g = torch.Generator().manual_seed(15)
    sa = (torch.rand(M, K // 16, generator=g) * 4).to(E4)
    sb = (torch.rand(N, K // 16, generator=g) * 4).to(E4)
    ga, gb = torch.tensor(0.03), torch.tensor(1.5)
    da = fp4_values(a) * sa.float().repeat_interleave(16, 1)
    db = fp4_values(bt) * sb.float().repeat_interleave(16, 1)
    want = ((da @ db.T) * (ga * gb)).to(torch.float32)
    got = F.scaled_mm(*tpu(a, bt.T), [swizzle(sa).to("tpu"), ga.to("tpu")],
                      [ST.BlockWise1x16, ST.TensorWise], [swizzle(sb).to("tpu"), gb.to("tpu")],
                      [ST.BlockWise1x16, ST.TensorWise],
                      swizzle_a=[SW.SWIZZLE_32_4_4, SW.NO_SWIZZLE],
                      swizzle_b=[SW.SWIZZLE_32_4_4, SW.NO_SWIZZLE], output_dtype=torch.float32)
    close(got, want)


def test_scaled_mm_bad_scales_raise():
    a, b = tpu(fp8((32, 64)), col_major(fp8((64, 48))))
    with pytest.raises(RuntimeError, match="Invalid scaling configuration|scale"):
        torch._scaled_mm(a, b, torch.ones(32, 3, device="tpu"), torch.ones(1, 48, device="tpu"),
                         out_dtype=torch.bfloat16)
    # torch 2.13's F.scaled_mm checks the shape itself; 2.14 leaves it to the op (_scaled_mm_v2)
    with pytest.raises((RuntimeError, ValueError), match="scale_a must have shape|scale_a: row-wise scales need 32"):
        F.scaled_mm(a, b, torch.ones(31, 1, device="tpu"), ST.RowWise,
                    torch.ones(1, 48, device="tpu"), ST.RowWise)
    with pytest.raises(RuntimeError, match="MX scaling|swizzled block scales need"):
        F.scaled_mm(a, b, torch.ones(32, 2, device="tpu").to(E8), ST.BlockWise1x32,
                    torch.ones(48, 2, device="tpu").to(E8), ST.BlockWise1x32,
                    swizzle_a=SW.SWIZZLE_32_4_4, swizzle_b=SW.SWIZZLE_32_4_4)


def test_scaled_mm_is_native():
    torchtpu.reset_metrics()
    a, b = tpu(fp8((32, 64)), col_major(fp8((64, 48))))
    one = torch.tensor(1.0, device="tpu")
    torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16).cpu()
    F.scaled_mm(a, b, one, ST.TensorWise, one, ST.TensorWise).cpu()
    m = torchtpu.metrics()
    assert m["cpu_fallbacks"] == {}


@pytest.mark.slow
def test_scaled_matmuls_in_compiled_graph():
    from torchtpu import quant as Q

    torch.manual_seed(0)
    x, w = torch.randn(16, 64), torch.randn(32, 64)
    qa, sa = [t.to("tpu") for t in Q.quantize_mx(x)]
    qb, sb = [t.to("tpu") for t in Q.quantize_mx(w)]
    a8, b8 = tpu(x.to(E4), w.to(E4))
    one = torch.tensor(0.5, device="tpu")

    def f(qa, sa, qb, sb, a8, b8, one):
        return (Q.mx_matmul(qa, sa, qb, sb, out_dtype=torch.float32)
                + torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.float32))

    want = f(qa, sa, qb, sb, a8, b8, one).cpu()
    before = torchtpu.metrics()["compile"]
    got = torch.compile(f, backend="tpu", dynamic=False)(qa, sa, qb, sb, a8, b8, one).cpu()
    after = torchtpu.metrics()["compile"]
    assert after["graphs_compiled"] == before["graphs_compiled"] + 1
    assert after["graph_fallbacks"] == before["graph_fallbacks"]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("dt", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz], ids=str)
def test_scaled_mm_fnuz_vs_cpu(dt):
    a, b = fp8((16, 32), dt, 20, 4.0), col_major(fp8((32, 16), dt, 21, 4.0))
    sa, sb = torch.tensor(0.5), torch.tensor(3.0)
    # the reference is the exact upcast product: CPU's _scaled_mm refuses fnuz
    # where oneDNN lacks it (itensor_view_from_dense), depending on the host CPU
    want = (a.double() @ b.double() * 1.5).float()
    close(torch._scaled_mm(*tpu(a, b, sa, sb), out_dtype=torch.float32), want)
