"""copy_/.to() between tpu and CPU for every dtype, contiguous or not."""
import pytest
import torch

DEV = "tpu"

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.complex64]


def sample(dtype, shape=(5, 6)):
    n = 1
    for s in shape:
        n *= s
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 8
        return x.to(dtype)
    info = torch.iinfo(dtype)
    x = torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=torch.int64)
    x.view(-1)[0] = info.min
    x.view(-1)[1] = info.max
    return x.to(dtype)


def bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip(dtype):
    c = sample(dtype)
    t = c.to(DEV)
    assert t.device.type == "tpu" and t.dtype == dtype and t.shape == c.shape
    bits_equal(t.cpu(), c)
    bits_equal(t.to("cpu"), c)
    # copy_ both ways into preexisting tensors
    d = torch.empty(c.shape, dtype=dtype, device=DEV)
    d.copy_(c)
    bits_equal(d.cpu(), c)
    h = torch.empty_like(c)
    h.copy_(d)
    bits_equal(h, c)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_noncontiguous_src_and_dst(dtype):
    c = sample(dtype, (6, 8))
    t = c.to(DEV)
    # non-contiguous tpu source -> cpu
    bits_equal(t.t().cpu(), c.t())
    bits_equal(t[1::2, ::3].cpu(), c[1::2, ::3])
    # non-contiguous cpu source -> tpu
    bits_equal(c.t().to(DEV).cpu(), c.t().contiguous())
    # into non-contiguous tpu destination
    dt = torch.zeros(8, 6, dtype=dtype, device=DEV)
    dc = torch.zeros(8, 6, dtype=dtype)
    dt.t().copy_(c)
    dc.t().copy_(c)
    bits_equal(dt.cpu(), dc)
    dt[::2, 1:4].copy_(c[:4, :3].t().contiguous().t())
    dc[::2, 1:4].copy_(c[:4, :3].t().contiguous().t())
    bits_equal(dt.cpu(), dc)
    # non-contiguous tpu source into non-contiguous cpu destination
    hc = torch.zeros(6, 8, dtype=dtype)
    hc[:, ::2].copy_(t[:, 1::2])
    ref = torch.zeros(6, 8, dtype=dtype)
    ref[:, ::2].copy_(c[:, 1::2])
    bits_equal(hc, ref)
    # tpu -> tpu same dtype, non-contiguous both
    e = torch.zeros(6, 8, dtype=dtype, device=DEV)
    e[1:].copy_(t[:-1].flip(0) if False else t[:-1])
    ref = torch.zeros(6, 8, dtype=dtype)
    ref[1:].copy_(c[:-1])
    bits_equal(e.cpu(), ref)
    # broadcasting copy
    b = torch.zeros(3, 6, 8, dtype=dtype, device=DEV)
    b.copy_(t)
    bits_equal(b.cpu(), c.expand(3, 6, 8))


CONVERT_SRC = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("src", CONVERT_SRC, ids=str)
def test_dtype_converting_copy_on_device(src):
    c = sample(src, (4, 5))
    if src.is_floating_point:
        c = c.clamp(-100, 100)
    t = c.to(DEV)
    for dst in CONVERT_SRC + [torch.complex64]:
        if src.is_floating_point and dst in (torch.uint8, torch.int8, torch.bool):
            # float->small int of out-of-range/negative values is UB in C++
            cc = c.abs().clamp(0, 100) if dst != torch.int8 else c.clamp(-100, 100)
            tt = cc.to(DEV)
        else:
            cc, tt = c, t
        want = cc.to(dst)
        got = tt.to(dst)
        assert got.device.type == "tpu" and got.dtype == dst
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"{src}->{dst}: {m}")
        # copy_ into an existing tensor of another dtype, non-contiguous dst
        d = torch.zeros(5, 4, dtype=dst, device=DEV)
        d.t().copy_(tt)
        torch.testing.assert_close(d.t().cpu(), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_float8_conversions(dtype):
    c = torch.linspace(-20, 20, 41)
    want = c.to(dtype)
    got = c.to(DEV).to(dtype)
    bits_equal(got.cpu(), want)
    torch.testing.assert_close(got.to(torch.float32).cpu(), want.to(torch.float32), rtol=0, atol=0)


def test_cpu_to_tpu_with_conversion():
    c = torch.arange(10, dtype=torch.int32)
    d = torch.zeros(10, dtype=torch.float64, device=DEV)
    d.copy_(c)
    torch.testing.assert_close(d.cpu(), c.double())
    h = torch.zeros(10, dtype=torch.int16)
    h.copy_(d)
    torch.testing.assert_close(h, c.short())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_item_tolist_0d(dtype):
    c = sample(dtype, (3,))
    t = c.to(DEV)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert t[1].item() == c[1].item()
        return
    assert t[1].item() == c[1].item()
    assert type(t[1].item()) is type(c[1].item())
    assert t.tolist() == c.tolist()
    z = c[2].clone()
    zt = z.to(DEV)
    assert zt.dim() == 0
    bits_equal(zt.cpu(), z)
    assert zt.item() == z.item()


def test_scalar_tensor_and_python_scalars():
    t = torch.tensor(3.5, device=DEV)
    assert t.dim() == 0 and t.item() == 3.5
    assert float(t) == 3.5 and int(torch.tensor(7, device=DEV)) == 7
    assert bool(torch.tensor(True, device=DEV)) is True
    assert torch.tensor([[1, 2], [3, 4]], device=DEV).tolist() == [[1, 2], [3, 4]]
    assert torch.tensor(2 + 3j, device=DEV).item() == 2 + 3j


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16], ids=str)
def test_empty_tensors(dtype):
    for shape in ((0,), (3, 0), (0, 4, 2)):
        c = torch.zeros(shape, dtype=dtype)
        t = c.to(DEV)
        assert t.shape == c.shape and t.numel() == 0
        assert t.cpu().shape == c.shape
        assert t.tolist() == c.tolist()
        d = torch.empty(shape, dtype=dtype, device=DEV)
        d.copy_(c)
        h = torch.empty(shape, dtype=dtype)
        h.copy_(t)
    with pytest.raises(RuntimeError):
        torch.empty(0, device=DEV).item()


def test_to_same_device_returns_self_and_copy_flag():
    t = torch.ones(3, device=DEV)
    assert t.to(DEV) is t
    u = t.to(DEV, copy=True)
    assert u is not t and u.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    u.fill_(2)
    assert t.cpu().tolist() == [1, 1, 1]


def test_non_blocking_copies():
    c = torch.randn(100)
    t = c.to(DEV, non_blocking=True)
    back = t.to("cpu", non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(back, c, rtol=0, atol=0)


def test_large_copy_and_metrics_bytes():
    import torchtpu

    torchtpu.reset_metrics()
    c = torch.randn(256, 1024)
    t = c.to(DEV)
    m = torchtpu.metrics()
    assert m["bytes_host_to_device"] >= c.numel() * 4
    back = t.cpu()
    m = torchtpu.metrics()
    assert m["bytes_device_to_host"] >= c.numel() * 4
    torch.testing.assert_close(back, c, rtol=0, atol=0)


def test_copy_errors_like_cpu():
    t = torch.zeros(3, device=DEV)
    with pytest.raises(RuntimeError):
        t.copy_(torch.zeros(4))
    with pytest.raises(RuntimeError):
        torch.zeros(4).copy_(t)
    with pytest.raises(RuntimeError):
        t.copy_(torch.zeros(2, 3, device=DEV))
