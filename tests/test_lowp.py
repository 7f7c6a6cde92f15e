"""Low-precision dtypes on tpu (float8_*, float8_e8m0fnu, float4_e2m1fn_x2):
bit-exact casts against CPU PyTorch, copies, views, bitcasts, cat/index/slice."""
import pytest
import torch

import torchtpu

F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
      torch.float8_e8m0fnu]
WIDE = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    return t.view(_INT[t.element_size()])


def assert_same_bits(got, want, nan_payload=True):
    """Bitwise equality; NaNs in wide floats only need to be NaN where CPU has
    NaN (PyTorch's own NaN payloads differ between its scalar and vector paths)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    got = got.cpu()
    if not nan_payload and want.is_floating_point():
        wn, gn = want.isnan(), got.isnan()
        assert torch.equal(wn, gn), f"NaN positions differ: {(wn != gn).nonzero()[:8].tolist()}"
        got, want = got[~gn], want[~wn]
    bad = (bits(got) != bits(want)).nonzero().flatten()
    assert bad.numel() == 0, (f"{bad.numel()} mismatches, first at {bad[:6].tolist()}: "
                              f"got {got[bad[:6]].tolist()} want {want[bad[:6]].tolist()}")


def all_patterns(dt):
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt)


def float_grid():
    """Every bfloat16 value (as f32), f32 values just around each f8 rounding
    boundary and random f32 bit patterns."""
    g = [torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()]
    for dt in F8:
        v = all_patterns(dt).float()
        v = v[v.isfinite()].unique()
        mid = (v[1:] + v[:-1]) / 2
        for x in (v, mid):
            g += [x, x.nextafter(torch.tensor(float("inf"))), x.nextafter(torch.tensor(-float("inf")))]
        g.append(-mid)
    gen = torch.Generator().manual_seed(0)
    g.append(torch.randint(-2**31, 2**31 - 1, (50000,), generator=gen, dtype=torch.int32).view(torch.float32))
    return torch.cat(g)


@pytest.mark.parametrize("dt", F8, ids=str)
def test_f8_patterns_roundtrip_and_widen(dt):
    c = all_patterns(dt)
    t = c.to("tpu")
    assert t.dtype == dt
    assert_same_bits(t.cpu(), c)
    for wide in WIDE:
        assert_same_bits(t.to(wide), c.to(wide), nan_payload=dt == torch.float8_e8m0fnu and wide == torch.float32)
    for other in F8:  # f8 -> f8 goes through float, as in c10
        if other != dt:
            assert_same_bits(t.to(other), c.to(other))
    # integers and bool: through float (inside int32's range: CPU's overflow is undefined)
    fin = c[c.float().abs() < 2.0 ** 31]
    for it in (torch.int32, torch.int64, torch.bool):
        assert_same_bits(fin.to("tpu").to(it), fin.to(it))


def _f32_denormal(d):
    # XLA:CPU flushes f32 denormals to zero in f64 -> f32 converts (PyTorch
    # rounds f64 through f32); among the f8 types only e8m0 can tell.
    return (d != 0) & (d.abs() < torch.finfo(torch.float32).tiny)


@pytest.mark.parametrize("dt", F8, ids=str)
def test_f8_narrowing_dense_grid(dt):
    x = float_grid()
    xt = x.to("tpu")
    assert_same_bits(xt.to(dt), x.to(dt))
    for src in (torch.bfloat16, torch.float16, torch.float64):
        xs = x.to(src)
        if src == torch.float64 and dt == torch.float8_e8m0fnu:
            xs = xs[~_f32_denormal(xs)]
        assert_same_bits(xs.to("tpu").to(dt), xs.to(dt))
    # f64 values that round differently when rounded directly (PyTorch rounds through f32)
    d = (x[x.isfinite()].double() * (1 + 2.0 ** -30))
    if dt == torch.float8_e8m0fnu:
        d = d[~_f32_denormal(d)]
    assert_same_bits(d.to("tpu").to(dt), d.to(dt))
    ints = torch.arange(-70000, 70000, 7, dtype=torch.int64)
    assert_same_bits(ints.to("tpu").to(dt), ints.to(dt))


@pytest.mark.parametrize("dt", F8 + [torch.float4_e2m1fn_x2], ids=str)
def test_lowp_copies_views_bitcasts(dt):
    gen = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (6, 8), generator=gen, dtype=torch.int32).to(torch.uint8)
    if dt == torch.float8_e5m2:
        # XLA:CPU computes some data movement (concatenate) on e5m2 through a
        # wider float, which canonicalizes its NaNs (0x7d..0x7f, 0xfd..0xff ->
        # 0x7f): keep that one NaN here (the casts above check all bits).
        raw = torch.where((raw & 0x7f) > 0x7c, torch.full_like(raw, 0x7f), raw)
    c = raw.view(dt)
    t = c.to("tpu")
    assert t.dtype == dt and t.device.type == "tpu"
    assert_same_bits(t.view(torch.uint8), raw)
    assert_same_bits(raw.to("tpu").view(dt), c)
    assert_same_bits(t.view(torch.int8), c.view(torch.int8))
    assert_same_bits(t[1:4, ::2], c[1:4, ::2])
    assert_same_bits(t.t().contiguous(), c.t().contiguous())
    assert_same_bits(t.clone(), c.clone())
    assert_same_bits(torch.cat([t, t[:2]]), torch.cat([c, c[:2]]))
    assert_same_bits(torch.stack([t[0], t[1]]), torch.stack([c[0], c[1]]))
    idx = torch.tensor([4, 0, 2])
    assert_same_bits(t[idx.to("tpu")], c.view(torch.uint8)[idx].view(dt))
    assert_same_bits(t.index_select(1, idx.to("tpu")), c.view(torch.uint8).index_select(1, idx).view(dt))
    # a 2-byte view of the same storage
    assert_same_bits(t.view(torch.int16), c.view(torch.int16))
    # writes through views
    u = t.clone()
    u[2:4] = t[0:2]
    w = c.clone()
    w[2:4] = c[0:2]
    assert_same_bits(u, w)
    # device -> device copy into another f8 tensor, and from the host
    e = torch.empty(6, 8, dtype=dt, device="tpu")
    e.copy_(t)
    assert_same_bits(e, c)
    e.copy_(c)
    assert_same_bits(e, c)


def test_lowp_creation():
    for dt in F8:
        assert_same_bits(torch.zeros(5, dtype=dt, device="tpu"), torch.zeros(5, dtype=dt))
        assert_same_bits(torch.ones(5, dtype=dt, device="tpu"), torch.ones(5, dtype=dt))
        for v in (-3.3, 0.1, 1e-30, 448.0, 2.0 ** 20, 240.0):
            try:
                want = torch.full((3,), v, dtype=dt)
            except RuntimeError:  # CPU refuses scalars that overflow the dtype
                continue
            assert_same_bits(torch.full((3,), v, dtype=dt, device="tpu"), want)
            assert_same_bits(torch.empty(3, dtype=dt, device="tpu").fill_(v), want)
        x = torch.randn(16)
        assert_same_bits(torch.tensor(x.tolist(), dtype=dt, device="tpu"), torch.tensor(x.tolist(), dtype=dt))
    z = torch.zeros(3, 4, dtype=torch.float4_e2m1fn_x2, device="tpu")
    assert z.dtype == torch.float4_e2m1fn_x2
    assert_same_bits(z.view(torch.uint8), torch.zeros(3, 4, dtype=torch.uint8))


def test_fp4x2_has_no_casts_like_cpu():
    t = torch.zeros(4, dtype=torch.uint8, device="tpu").view(torch.float4_e2m1fn_x2)
    with pytest.raises(RuntimeError, match="not implemented for 'Float4_e2m1fn_x2'"):
        torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).float()
    with pytest.raises(RuntimeError, match="Float4_e2m1fn_x2"):
        t.float()
    with pytest.raises(RuntimeError, match="Float4_e2m1fn_x2"):
        torch.zeros(4, device="tpu").to(torch.float4_e2m1fn_x2)


def test_lowp_casts_are_native():
    torchtpu.reset_metrics()
    x = torch.randn(64, device="tpu")
    for dt in F8:
        x.to(dt).float().cpu()
    assert torchtpu.metrics()["cpu_fallbacks"] == {}


def test_fp4x2_arithmetic_raises_like_cpu():
    """Packed pairs are bytes on tpu: ops that would compute on them raise
    (as CPU's), data movement works."""
    c = torch.tensor([1, 2, 0x3f], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    t = c.to("tpu")
    for f in (lambda u: u + u, lambda u: u * 2, lambda u: u.sum(), lambda u: -u, lambda u: u.max(),
              lambda u: u.clone().fill_(1)):
        with pytest.raises(NotImplementedError, match="Float4_e2m1fn_x2"):
            f(c)
        with pytest.raises(NotImplementedError, match="Float4_e2m1fn_x2"):
            f(t)
    assert_same_bits(torch.where(t == t, t, t), torch.where(c == c, c, c))
    assert_same_bits(t.flip(0), c.view(torch.uint8).flip(0).view(torch.float4_e2m1fn_x2))
