"""Shared check for op tests: run fn on CPU and on tpu, compare outputs and
input gradients with CPU PyTorch, and require that no op fell back to CPU."""
import torch

import torchtpu

DEV = "tpu"


def _to(v, dev):
    return v.detach().to(dev) if isinstance(v, torch.Tensor) else v


def check(fn, *inputs, grad=True, allowed=(), atol=None, rtol=None, equal_nan=True, grad_equal_nan=False):
    """fn(dev, *inputs) on CPU and tpu; compares outputs (dtype, shape, values) and input grads."""
    torchtpu.reset_metrics()
    ci = [_to(i, "cpu").requires_grad_(grad and i.is_floating_point()) for i in inputs]
    ti = [_to(i, DEV).requires_grad_(grad and i.is_floating_point()) for i in inputs]
    e, r = fn("cpu", *ci), fn(DEV, *ti)
    es = e if isinstance(e, tuple) else (e,)
    rs = r if isinstance(r, tuple) else (r,)
    tol = {} if atol is None else dict(atol=atol, rtol=rtol)
    for a, b in zip(rs, es):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a.cpu(), b, equal_nan=equal_nan, **tol)
    if grad:
        gi = [i for i in ci if i.requires_grad]
        gti = [i for i in ti if i.requires_grad]
        if gi and es[0].requires_grad:
            go = torch.randn_like(es[0])
            ge = torch.autograd.grad(es[0], gi, go, allow_unused=True)
            gr = torch.autograd.grad(rs[0], gti, go.to(DEV), allow_unused=True)
            for a, b in zip(gr, ge):
                assert (a is None) == (b is None)
                if b is not None:
                    torch.testing.assert_close(a.cpu(), b, equal_nan=grad_equal_nan, **tol)
    fb = {k: v for k, v in torchtpu.metrics()["cpu_fallbacks"].items() if k not in allowed}
    assert not fb, f"CPU fallbacks: {fb}"
