"""Native FFTs (aten::_fft_c2c / _fft_r2c / _fft_c2r, lowered to stablehlo.fft):
torch.fft.* and torch.stft on tpu vs CPU torch (values and gradients, f32 and
f64, every norm), with no CPU fallback, eagerly and under torch.compile."""
import os

import pytest
import torch

import torchtpu
from optest import check
from torchtpu.compile import lower as _compile

DEV = "tpu"
NORMS = ("backward", "ortho", "forward")
FFT_OPS = ("aten::_fft_c2c", "aten::_fft_r2c", "aten::_fft_c2r")
# Programs held to TPU rules (TORCHTPU_TPU_CHECK): XLA's TPU FFT takes float32/complex64 only
TPU_TARGET = bool(os.environ.get("TORCHTPU_TPU_CHECK"))


def _rand(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        part = torch.float64 if dtype == torch.complex128 else torch.float32
        return torch.complex(torch.randn(shape, generator=g, dtype=part),
                             torch.randn(shape, generator=g, dtype=part))
    return torch.randn(shape, generator=g, dtype=dtype)


def _tol(dtype):
    return (1e-10, 1e-10) if dtype in (torch.float64, torch.complex128) else (2e-5, 2e-5)


def _cplx(dtype):
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _no_fft_fallback():
    fb = torchtpu.metrics()["cpu_fallbacks"]
    assert not [k for k in fb if "fft" in k], fb


# (name, fn(x, norm), input is complex, shapes)
CASES = {
    "fft": (lambda x, n: torch.fft.fft(x, norm=n), False),
    "fft_complex": (lambda x, n: torch.fft.fft(x, norm=n), True),
    "fft_dim0": (lambda x, n: torch.fft.fft(x, dim=0, norm=n), True),
    "fft_n_pad": (lambda x, n: torch.fft.fft(x, n=11, dim=-1, norm=n), True),
    "fft_n_trim": (lambda x, n: torch.fft.fft(x, n=3, dim=0, norm=n), True),
    "ifft": (lambda x, n: torch.fft.ifft(x, norm=n), True),
    "ifft_dim1": (lambda x, n: torch.fft.ifft(x, dim=1, norm=n), True),
    "rfft": (lambda x, n: torch.fft.rfft(x, norm=n), False),
    "rfft_dim0": (lambda x, n: torch.fft.rfft(x, dim=0, norm=n), False),
    "rfft_odd_n": (lambda x, n: torch.fft.rfft(x, n=7, norm=n), False),
    "irfft": (lambda x, n: torch.fft.irfft(x, norm=n), True),
    "irfft_odd_n": (lambda x, n: torch.fft.irfft(x, n=9, dim=1, norm=n), True),
    "irfft_dim0": (lambda x, n: torch.fft.irfft(x, dim=0, norm=n), True),
    "fft2": (lambda x, n: torch.fft.fft2(x, norm=n), True),
    "fft2_dims_0_2": (lambda x, n: torch.fft.fft2(x, dim=(0, 2), norm=n), True),
    "ifft2": (lambda x, n: torch.fft.ifft2(x, norm=n), True),
    "fftn": (lambda x, n: torch.fft.fftn(x, norm=n), False),
    "fftn_s": (lambda x, n: torch.fft.fftn(x, s=(5, 4), dim=(2, 0), norm=n), True),
    "ifftn": (lambda x, n: torch.fft.ifftn(x, norm=n), True),
    "rfft2": (lambda x, n: torch.fft.rfft2(x, norm=n), False),
    "rfftn": (lambda x, n: torch.fft.rfftn(x, norm=n), False),
    "rfftn_dims_2_0": (lambda x, n: torch.fft.rfftn(x, dim=(2, 0), norm=n), False),
    "irfft2": (lambda x, n: torch.fft.irfft2(x, norm=n), True),
    "irfftn": (lambda x, n: torch.fft.irfftn(x, norm=n), True),
    "irfftn_s": (lambda x, n: torch.fft.irfftn(x, s=(6, 7), dim=(0, 1), norm=n), True),
    "hfft": (lambda x, n: torch.fft.hfft(x, norm=n), True),
    "hfft_n": (lambda x, n: torch.fft.hfft(x, n=7, dim=0, norm=n), True),
    "ihfft": (lambda x, n: torch.fft.ihfft(x, norm=n), False),
    "hfft2": (lambda x, n: torch.fft.hfft2(x, norm=n), True),
    "ihfftn": (lambda x, n: torch.fft.ihfftn(x, norm=n), False),
    "fftshift_fft": (lambda x, n: torch.fft.fftshift(torch.fft.fft(x, norm=n), dim=-1), True),
    "fftshift_fft2": (lambda x, n: torch.fft.ifftshift(torch.fft.fftshift(torch.fft.fft2(x, norm=n))), False),
    "transposed_input": (lambda x, n: torch.fft.fft(x.transpose(0, 2), norm=n), True),
    "sliced_input": (lambda x, n: torch.fft.rfft(x[:, ::2], dim=1, norm=n), False),
}
SHAPE = (4, 6, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_fft_values_and_grads(name, norm, dtype):
    f, complex_in = CASES[name]
    x = _rand(SHAPE, _cplx(dtype) if complex_in else dtype)
    if TPU_TARGET and dtype == torch.float64:
        with pytest.raises(RuntimeError, match="does not compile for TPU"):
            f(x.to(DEV), norm)
        return
    atol, rtol = _tol(dtype)
    # gradient of the first output w.r.t. x (real or complex), vs CPU autograd
    check(lambda d, x: f(x, norm), x, grad=(0,), atol=atol, rtol=rtol)


@pytest.mark.parametrize("shape,dim", [((16,), -1), ((3, 8), -1), ((2, 3, 4, 5), (0, 3)),
                                       ((2, 3, 4, 5, 3), None), ((2, 2, 3, 2, 3, 2), (5, 0, 2, 3))])
def test_fftn_many_dims(shape, dim):
    # more than 3 transformed dims: stablehlo.fft takes at most 3, done in groups
    x = _rand(shape, torch.float32)
    xc = _rand(shape, torch.complex64, seed=1)
    tol = dict(atol=5e-5, rtol=5e-5)
    check(lambda d, x: torch.fft.fftn(x, dim=dim), xc, grad=(0,), **tol)
    check(lambda d, x: torch.fft.rfftn(x, dim=dim), x, grad=(0,), **tol)
    check(lambda d, x: torch.fft.irfftn(x, dim=dim), xc, grad=(0,), **tol)
    check(lambda d, x: torch.fft.ifftn(x, dim=dim, norm="ortho"), xc, grad=(0,), **tol)


def test_raw_aten_ops():
    # the three ops as called directly (every normalization; r2c two-sided; c2r last_dim_size)
    x = _rand((3, 8, 6), torch.float32)
    xc = _rand((3, 8, 6), torch.complex64)
    a = torch.ops.aten
    for norm in (0, 1, 2):
        for fwd in (True, False):
            check(lambda d, t: a._fft_c2c(t, [2, 0], norm, fwd), xc, grad=(0,))
        for onesided in (True, False):
            check(lambda d, t: a._fft_r2c(t, [0, 1], norm, onesided), x, grad=(0,))
        for last in (10, 11):
            check(lambda d, t: a._fft_c2r(t, [1, 2], norm, last), xc, grad=(0,))
    # c2c over no dims copies
    check(lambda d, t: a._fft_c2c(t, [], 0, True), xc, grad=False)


def test_out_forms():
    x = _rand((5, 8), torch.float32)
    xc = _rand((5, 8), torch.complex64)

    def f(d, x, xc):
        o1 = torch.empty(0, dtype=torch.complex64, device=d)
        o2 = torch.empty(0, dtype=torch.float32, device=d)
        o3 = torch.empty(0, dtype=torch.complex64, device=d)
        torch.fft.rfft(x, out=o1)
        torch.fft.irfft(xc, out=o2)
        torch.fft.fft(xc, dim=0, out=o3)
        return o1, o2, o3

    check(f, x, xc, grad=False)


def test_empty_batch():
    # (CPU's MKL rejects an empty batch; tpu returns the empty result meta gives)
    x = torch.zeros(0, 8, dtype=torch.complex64, device=DEV)
    for y, shape, dtype in ((torch.fft.fft(x), (0, 8), torch.complex64),
                            (torch.fft.rfft(x.real), (0, 5), torch.complex64),
                            (torch.fft.irfft(x), (0, 14), torch.float32)):
        assert y.device.type == DEV and y.shape == shape and y.dtype == dtype
        assert y.cpu().numel() == 0


@pytest.mark.skipif(TPU_TARGET, reason="float64 FFTs are refused for TPU (test_fft_values_and_grads checks the error)")
def test_float64_precision():
    # XLA's CPU plugin computes f64 FFTs in f64 (not via f32)
    x = _rand((64, 128), torch.float64)
    r = torch.fft.irfft(torch.fft.rfft(x.to(DEV)), n=128).cpu()
    assert (r - x).abs().max().item() < 1e-13
    e = torch.fft.fft2(x.to(torch.complex128))
    t = torch.fft.fft2(x.to(DEV).to(torch.complex128)).cpu()
    assert (t - e).abs().max().item() < 1e-10
    _no_fft_fallback()


def test_grad_through_loss():
    # autograd of an FFT pipeline: the backward ops are native too
    torchtpu.reset_metrics()
    x = _rand((4, 32), torch.float32)

    def loss(x):
        y = torch.fft.rfft(x, norm="ortho")
        y = y * torch.exp(1j * torch.linspace(0, 1, y.shape[-1], device=x.device))
        z = torch.fft.irfft(y, n=32, norm="ortho")
        return (z ** 2).sum() + torch.fft.fft(x).abs().sum()

    xc, xt = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    loss(xc).backward()
    loss(xt).backward()
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, atol=1e-4, rtol=1e-4)
    nat = torchtpu.metrics()["native_ops"]
    assert all(any(k.startswith(op) for k in nat) for op in FFT_OPS), nat
    _no_fft_fallback()


def test_stft_istft_round_trip():
    torchtpu.reset_metrics()
    sig = _rand((2, 400), torch.float32)

    def run(d, s):
        w = torch.hann_window(64, device=d)
        spec = torch.stft(s, n_fft=64, hop_length=16, window=w, return_complex=True)
        back = torch.istft(spec, n_fft=64, hop_length=16, window=w, length=s.shape[-1])
        return spec, back

    spec_t, back_t = run(DEV, sig.to(DEV))
    spec_c, back_c = run("cpu", sig)
    torch.testing.assert_close(spec_t.cpu(), spec_c, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(back_t.cpu(), back_c, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(back_t.cpu(), sig, atol=1e-5, rtol=1e-5)
    _no_fft_fallback()


def test_no_fft_fallback_counted():
    torchtpu.reset_metrics()
    x = _rand((8, 8), torch.float32).to(DEV)
    torch.fft.irfft2(torch.fft.rfft2(x)).cpu()
    torch.fft.ifft(torch.fft.fft(x)).cpu()
    torch.fft.hfft(torch.fft.ihfft(x)).cpu()
    _no_fft_fallback()
    nat = torchtpu.metrics()["native_ops"]
    assert all(any(k.startswith(op) for k in nat) for op in FFT_OPS), nat


def test_bad_input_errors_name_the_op():
    a = torch.ops.aten
    xr = torch.randn(4, 8, device=DEV)
    xc = torch.randn(4, 8, dtype=torch.complex64, device=DEV)
    with pytest.raises(RuntimeError, match="_fft_c2c"):
        a._fft_c2c(xc, [0], 3, True)  # bad normalization
    with pytest.raises(RuntimeError, match="_fft_r2c"):
        a._fft_r2c(xr, [0], 7, True)
    with pytest.raises(RuntimeError, match="_fft_c2r"):
        a._fft_c2r(xc, [1], 0, 0)  # last_dim_size < 1
    with pytest.raises(RuntimeError, match="unique"):
        torch.fft.fftn(xc, dim=(1, -1))  # duplicate dim (torch's frontend check)
    with pytest.raises((RuntimeError, TypeError), match="ComplexHalf"):
        # half: no complex32 on tpu (CPU torch has no half FFT either)
        a._fft_r2c(xr.to(torch.float16), [0], 0, True)
    with pytest.raises((RuntimeError, IndexError)):
        torch.fft.fft(xc, dim=5)
    with pytest.raises((RuntimeError, TypeError)):
        torch.fft.rfft(xc)  # complex input to rfft


@pytest.mark.skipif(os.environ.get("TORCHTPU_MODE", "strict") != "strict", reason="compile test runs once")
def test_compiled_fft_forward_backward():
    torch._dynamo.reset()
    before = dict(_compile.stats)
    torchtpu.reset_metrics()

    def f(x, w):
        y = torch.fft.rfft(x, dim=-1)
        y = y * torch.fft.fft(w.to(y.dtype))[: y.shape[-1]]
        z = torch.fft.irfft(y, n=x.shape[-1], dim=-1)
        return torch.fft.fftshift(z, dim=-1).sin().sum() + torch.fft.fft2(x, norm="ortho").abs().sum()

    x, w = _rand((3, 16), torch.float32), _rand((16,), torch.float32, seed=2)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xt, wt = x.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
    ref = f(xc, wc)
    ref.backward()
    cf = torch.compile(f, backend="tpu", fullgraph=True)
    out = cf(xt, wt)
    out.backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(wt.grad.cpu(), wc.grad, atol=1e-4, rtol=1e-4)
    s = _compile.stats
    assert s["graphs_compiled"] - before["graphs_compiled"] == 2  # forward + backward
    assert s["graph_fallbacks"] == before["graph_fallbacks"]
    _no_fft_fallback()
    torch._dynamo.reset()


@pytest.mark.skipif(os.environ.get("TORCHTPU_MODE", "strict") != "strict", reason="modes run from strict")
@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_fft_in_each_eager_mode(mode):
    x = _rand((4, 8), torch.float32)
    with torchtpu.mode(mode):
        torchtpu.reset_metrics()
        xt = x.to(DEV).requires_grad_()
        y = torch.fft.irfft(torch.fft.rfft(xt, norm="ortho") * 2, n=8, norm="ortho")
        z = torch.fft.fft2(xt).abs().sum() + y.sum()
        z.backward()
        xc = x.clone().requires_grad_()
        yc = torch.fft.irfft(torch.fft.rfft(xc, norm="ortho") * 2, n=8, norm="ortho")
        zc = torch.fft.fft2(xc).abs().sum() + yc.sum()
        zc.backward()
        torch.testing.assert_close(z.detach().cpu(), zc.detach(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(xt.grad.cpu(), xc.grad, atol=1e-4, rtol=1e-4)
        _no_fft_fallback()
