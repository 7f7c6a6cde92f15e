"""C++ output-metadata rules (csrc/core/aten/meta.cpp): the commonest ops get
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
    aten = torch.ops.aten
    lng = torch.tensor([[0, 2], [3, 1]], device=dev)
    out += [aten.mul.Scalar(a, 2.5), aten.mul.Scalar(i, 2), aten.mul.Scalar(i, 1.5), aten.mul.Scalar(h, 3),
            aten.mul.Scalar(c, True), aten.div.Scalar(i, 2), aten.div.Scalar(c, 4.0), aten.add.Scalar(i, 1.5, 2),
            aten.add.Scalar(c, 1), aten.sub.Scalar(h, 0.5), aten.rsub.Scalar(i, 3), aten.rsub.Scalar(c, 1.0, 2),
            torch.cat([a, c]), torch.cat([a, c], 1), torch.cat([i, a]), torch.cat([h, i], -1),
            torch.cat([a.t(), c.t()]), torch.cat([a[None], a[None]]), torch.cat([torch.empty(0, device=dev), a]),
            a[lng], a[:, lng[0]], a[lng[0], lng[1]], c[lng[:, :1], lng[0]], i[None, lng[0]],
            torch.isin(i, lng), torch.isin(lng, i, invert=True), (a > 0).any(), a.any(1), (i > 3).any(0, True),
            a.any((0, 1)), (a > 0).all(), i.all(-1), (a > 0).all((1,), keepdim=True),
            torch.scatter(a, 1, lng, c[:2, :2]), torch.scatter(a, 0, lng, 1.5), torch.scatter(i, 1, lng, 7)]
    # abs/relu: a [1, n] row of a wider tensor (contiguous, odd size-1 stride; torch.istft's
    # window envelope), a transposed dense input, a [n, 1] column of a transposed tensor
    out += [a[1:2, 1:].abs(), F.relu(a[1:2, 1:]), c.abs(), F.relu(c), a.t()[:, :1].abs()]
    y = a.clone()
    y.scatter_(1, lng, c[:2, :2]).scatter_(0, lng, -2.0)
    out.append(y)
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


def test_strict_mode_uses_cpp_rules_for_joins_indexing_and_scalar_ops(metrics):
    # ops transformers' models run on every new shape (KV-cache cat, rotary and
    # attention scales, masks, token lookups)
    torchtpu._C._set_op_plans(True)
    aten = torch.ops.aten
    with torchtpu.mode("strict"):
        a = torch.randn(3, 5, 11, device=DEV)
        idx = torch.tensor([2, 0], device=DEV)
        outs = [torch.cat([a, a], -1), a[idx], aten.mul.Scalar(a, 0.5), aten.add.Scalar(a, 1.0, 1),
                aten.div.Scalar(a, 3.0), aten.rsub.Scalar(a, 1.0, 1), (a > 0).any(), (a > 0).all(-1),
                torch.isin(idx, idx), torch.scatter(a, 0, idx[:, None, None].expand(2, 5, 11), a[:2])]
        for o in outs:
            o.cpu()
    m = metrics()
    used = {"aten::cat", "aten::index.Tensor", "aten::mul.Scalar", "aten::add.Scalar", "aten::div.Scalar",
            "aten::rsub.Scalar", "aten::any", "aten::all.dim", "aten::isin.Tensor_Tensor", "aten::scatter.src"}
    assert not used & set(m["python_meta_ops"]), m["python_meta_ops"]


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
