"""CUDA's device rules for tensors of another device among tpu tensors.

Code developed on tpu must not break on CUDA: where CUDA accepts a CPU tensor
(a 0-d tensor used as a number in TensorIterator ops, CPU index tensors and
masks in indexing) tpu accepts it and computes what CPU computes; where CUDA
refuses (every op whose native_functions.yaml entry has no
`device_check: NoCheck`, and non-0-d CPU operands anywhere) tpu raises,
naming both devices, the argument and the op.
"""
import pytest
import torch

import torchtpu  # noqa: F401

DEV = "tpu"
g = torch.Generator().manual_seed(0)
A = torch.randn(4, 3, generator=g)
V = torch.randn(4, generator=g)
S = torch.tensor(0.25)  # a CPU 0-d tensor

# (name, fn(a, v) where a/v are tpu or cpu copies of A/V): CUDA accepts these
ACCEPTED = [
    ("add 0-d", lambda a, v: a + S),
    ("mul_ 0-d", lambda a, v: a.clone().mul_(S)),
    ("where 0-d other", lambda a, v: torch.where(a > 0, a, S)),
    ("masked_fill 0-d value", lambda a, v: a.masked_fill(a > 0, S)),
    ("masked_fill_ 0-d value", lambda a, v: a.clone().masked_fill_(a < 0, S)),
    ("lerp 0-d weight", lambda a, v: torch.lerp(a, a * 2, S)),
    ("fill_ 0-d", lambda a, v: a.clone().fill_(S)),
    ("pow 0-d exponent", lambda a, v: a.abs().pow(S)),
    ("index cpu indices", lambda a, v: a[torch.tensor([2, 0])]),
    ("index cpu mask", lambda a, v: v[torch.tensor([True, False, True, False])]),
    ("index 2 cpu indices", lambda a, v: a[torch.tensor([1, 3]), torch.tensor([0, 2])]),
    ("index_put_ cpu indices", lambda a, v: a.clone().index_put_((torch.tensor([1, 2]),), a[0].clone())),
    ("setitem cpu mask 0-d", lambda a, v: _setitem(v, torch.tensor([True, False, False, True]), S)),
    ("addcmul_ 0-d tensor1", lambda a, v: a.clone().addcmul_(S, a)),
    ("copy_ from cpu", lambda a, v: a.clone().copy_(A * 3)),
    ("eq 0-d", lambda a, v: v == S),
]


def _setitem(t, idx, val):
    t = t.clone()
    t[idx] = val
    return t


def _on(d):
    return A.to(d), V.to(d)


@pytest.mark.parametrize("name,fn", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_as_cuda_does_and_matches_cpu(name, fn):
    got = fn(*_on(DEV))
    ref = fn(*_on("cpu"))
    assert got.device.type == DEV, name
    torch.testing.assert_close(got.cpu(), ref)


# CUDA refuses these: (name, fn(a, v) with tpu a/v, argument named in the error)
REFUSED = [
    ("cat", lambda a, v: torch.cat([v, V]), "tensors"),
    ("stack", lambda a, v: torch.stack([v, V]), "tensors"),
    ("add 1-d cpu", lambda a, v: a + V[:3], "other"),
    ("cpu + tpu", lambda a, v: A + a, "self"),
    ("mm", lambda a, v: a.t() @ A, "mat2"),
    ("index_select cpu index", lambda a, v: a.index_select(0, torch.tensor([1])), "index"),
    ("index_select 0-d cpu index", lambda a, v: v.index_select(0, torch.tensor(1)), "index"),
    ("gather cpu index", lambda a, v: a.gather(1, torch.zeros(4, 1, dtype=torch.long)), "index"),
    ("scatter_add_ cpu src", lambda a, v: a.clone().scatter_add_(0, torch.zeros(1, 3, dtype=torch.long, device=DEV),
                                                                 A[:1]), "src"),
    ("embedding cpu indices", lambda a, v: torch.nn.functional.embedding(torch.tensor([1]), a), "index"),
    ("clamp 0-d cpu min", lambda a, v: a.clamp(min=S), "min"),
    ("where 1-d cpu", lambda a, v: torch.where(v > 0, v, V), "other"),
    ("masked_fill 1-d cpu mask", lambda a, v: v.masked_fill(V > 0, 1.0), "mask"),
    ("foreach add list", lambda a, v: torch._foreach_add([v], [V]), "other"),
    ("linear cpu bias", lambda a, v: torch.nn.functional.linear(a, a, V), None),
]


@pytest.mark.parametrize("name,fn,arg", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_as_cuda_does(name, fn, arg):
    with pytest.raises(RuntimeError) as e:
        fn(*_on(DEV))
    msg = str(e.value)
    assert "tpu:0" in msg and "cpu" in msg, msg
    if arg is not None:
        assert "same device" in msg and f"argument {arg}" in msg, msg


def test_op_table_follows_the_installed_torch():
    """The table of ops that take every tensor on one device is generated from
    the installed torch's native_functions.yaml (tools/gen_device_rules.py)."""
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("gen", os.path.join(root, "tools", "gen_device_rules.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    import torchgen

    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
    ops = set(gen.exact_same_ops(path))
    assert {"cat", "mm", "index_select", "embedding", "gather"} <= ops
    assert not {"add.Tensor", "index.Tensor", "where.self", "copy_", "masked_fill.Tensor"} & ops
