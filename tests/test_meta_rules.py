"""C++ output-metadata rules (csrc/core/meta.cpp): the commonest ops get
their output sizes, strides and dtypes from PyTorch's C++ meta functions
instead of the (Python) registered meta kernels. Debug mode runs both and
raises on any difference, so running a battery in debug mode checks them."""
import pytest
import torch
import torch.nn.functional as F

import torchtpu

DEV = "tpu"


def _battery(dev):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 6, generator=g)
    b = torch.randn(6, generator=g)
    c = torch.randn(6, 4, generator=g).t()  # non-contiguous
    i = torch.arange(24, dtype=torch.int32).reshape(4, 6)
    h = torch.randn(4, 6, generator=g).to(torch.bfloat16)
    a, b, c, i, h = (t.to(dev) for t in (a, b, c, i, h))
    out = [a + b, a - c, a * 2.5, i + 1, i * 1.5, i / 2, h + a, h * 2, a / c, torch.maximum(a, c),
           a.pow(2), a.pow(c.abs()), a > 0, i == 3, a <= c, torch.clamp(a, -0.5, 0.5), a.clamp_min(0),
           a.exp(), a.tanh(), a.sigmoid(), a.abs().sqrt(), a.abs().rsqrt(), -a, a.sin(), a.cos(), a.erf(),
           F.silu(a), F.gelu(a), F.gelu(a, approximate="tanh"), a.abs(), c.abs(), i.abs(), a.ceil(), a.floor(),
           a.trunc(), i & 5, i | 2, ~i, a.sum(1), a.sum(0, keepdim=True), a.mean(-1), h.sum(1),
           i.sum(1), a.amax(1), a.amin(0), a.argmax(1), a.argmin(), a.max(1).values, a.min(0).indices,
           a.cumsum(1), i.cumsum(0), a.softmax(-1), F.log_softmax(c, 0), a @ c.t(), torch.mm(a, c.t()), a.tril(),
           torch.addmm(b[:4], a, c.t()), torch.bmm(a[None], c.t()[None]),
           torch.baddbmm((a @ c.t())[None], a[None], c.t()[None]), F.relu(a), a.max(), i.min(),
           torch.lerp(a, c, 0.3), torch.addcmul(a, a, c, value=0.5), torch.addcdiv(a, a, c.abs() + 1),
           torch.gather(a, 1, torch.zeros(4, 2, dtype=torch.long, device=dev)), a.topk(2, 1).values,
           torch.empty(3, 3, device=dev).normal_().shape, torch.empty(5, device=dev).uniform_().shape,
           torch.empty(2, 2, device=dev).fill_(3.0), torch.ones(2, device=dev).zero_()]
    x = a.clone()
    x.add_(b).mul_(2).sub_(c, alpha=0.5).div_(3)
    out.append(x)
    logits = a.clone().requires_grad_()
    loss = F.cross_entropy(logits, torch.tensor([0, 1, 2, 3], device=dev))
    loss.backward()
    out += [loss, logits.grad]
    return out


def test_cpp_rules_agree_with_pytorch_meta_in_debug_mode(metrics):
    with torchtpu.mode("debug"):
        got = _battery(DEV)
    ref = _battery("cpu")
    for g, r in zip(got, ref):
        if isinstance(g, torch.Tensor):
            assert g.dtype == r.dtype and g.shape == r.shape and g.stride() == r.stride()
            torch.testing.assert_close(g.cpu(), r, rtol=2e-2, atol=1e-5, equal_nan=True)
        else:
            assert g == r


def test_strict_mode_uses_cpp_rules(metrics):
    torchtpu._C._set_op_plans(True)
    with torchtpu.mode("strict"):
        a = torch.randn(3, 5, 7, device=DEV)  # new shapes: not cached
        (a * a + a).sum(-1).softmax(-1)
    m = metrics()
    assert m["cpp_meta_rules"] >= 4
    assert not any(k in m["python_meta_ops"] for k in ("aten::mul.Tensor", "aten::add.Tensor", "aten::sum.dim_IntList"))


@pytest.mark.parametrize("case", ["broadcast", "inplace_broadcast", "inplace_cast", "mm", "bitwise_float"])
def test_cpp_rule_errors_match_cpu(case):
    def run(dev):
        a = torch.ones(3, 4, device=dev)
        if case == "broadcast":
            return a + torch.ones(5, device=dev)
        if case == "inplace_broadcast":
            return torch.ones(4, device=dev).add_(a)
        if case == "inplace_cast":
            return torch.ones(3, dtype=torch.long, device=dev).mul_(torch.full((3,), 1.5, device=dev))
        if case == "mm":
            return torch.mm(a, a)
        if case == "bitwise_float":
            return a & a
    with pytest.raises(RuntimeError) as cpu_err:
        run("cpu")
    with torchtpu.mode("strict"):
        with pytest.raises(RuntimeError) as tpu_err:
            run(DEV)
    # the same words (PyTorch's C++ checks produce both messages; CPU's kernel
    # names itself "bitwise_and_cpu")
    first = str(cpu_err.value).split("\n")[0][:40].replace("_cpu", "")
    assert first in str(tpu_err.value)


def test_first_ops_import_neither_dynamo_nor_sympy(pyrun):
    r = pyrun("import sys, torch, torchtpu\n"
              "x = torch.randn(3, 3, device='tpu')\n"
              "print(x + 1)\n"
              "y = (x @ x.t()).relu().sum(0).softmax(-1)\n"
              "print(y.cpu().shape)\n"
              "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules, torchtpu.metrics()['python_meta_ops'])")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("False False"), r.stdout
