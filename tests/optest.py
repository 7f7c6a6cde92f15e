"""Shared check for op tests: run fn on CPU and on tpu, compare outputs and
input gradients with CPU PyTorch, and require that no op fell back to CPU."""
import torch

import torchtpu

DEV = "tpu"


def _to(v, dev):
    return v.detach().to(dev) if isinstance(v, torch.Tensor) else v


def _leaf(v, dev, requires_grad):
    """A fresh copy of tensor v on dev (the caller's tensor is never aliased); other values as they are."""
    if not isinstance(v, torch.Tensor):
        return v
    return v.detach().to(dev, copy=True).requires_grad_(requires_grad)


def check(fn, *inputs, grad=True, allowed=(), atol=None, rtol=None, equal_nan=True, grad_equal_nan=False,
          pass_dev=True):
    """fn(dev, *inputs) on CPU and tpu (fn(*inputs) with pass_dev=False): the outputs (a tensor, or a
    tuple / list of them) match in number, device, dtype, shape and values, the input gradients of
    the first output match, and no op fell back to CPU unless named in `allowed`.

    grad: True differentiates every floating input (when the CPU output is differentiable); False or
    () none; a tuple of input positions differentiates exactly those (the first output must then be
    differentiable). atol/rtol (default: torch.testing's per-dtype ones) apply to values and grads."""
    torchtpu.reset_metrics()
    if grad is True:
        wants = [isinstance(i, torch.Tensor) and i.is_floating_point() for i in inputs]
    else:
        wants = [k in (grad or ()) for k in range(len(inputs))]
    ci = [_leaf(i, "cpu", w) for i, w in zip(inputs, wants)]
    ti = [_leaf(i, DEV, w) for i, w in zip(inputs, wants)]
    call = fn if pass_dev else (lambda _dev, *a: fn(*a))
    e, r = call("cpu", *ci), call(DEV, *ti)
    es = e if isinstance(e, (tuple, list)) else (e,)
    rs = r if isinstance(r, (tuple, list)) else (r,)
    assert len(rs) == len(es), (len(rs), len(es))
    tol = {} if atol is None else dict(atol=atol, rtol=rtol)
    for a, b in zip(rs, es):
        assert a.device.type == DEV, a.device
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        torch.testing.assert_close(a.cpu(), b, equal_nan=equal_nan, **tol)
    gi = [i for i, w in zip(ci, wants) if w]
    gti = [i for i, w in zip(ti, wants) if w]
    if gi and (grad is not True or es[0].requires_grad):
        go = torch.randn_like(es[0])
        ge = torch.autograd.grad(es[0], gi, go, allow_unused=True)
        gr = torch.autograd.grad(rs[0], gti, go.to(DEV), allow_unused=True)
        for a, b in zip(gr, ge):
            assert (a is None) == (b is None)
            if b is not None:
                torch.testing.assert_close(a.cpu(), b, equal_nan=grad_equal_nan, **tol)
    fb = {k: v for k, v in torchtpu.metrics()["cpu_fallbacks"].items() if k not in allowed}
    assert not fb, f"CPU fallbacks: {fb}"
