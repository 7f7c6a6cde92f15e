"""float32 matmul precision as PyTorch defines it (issue 34).

torch.get_float32_matmul_precision() ("highest" by default) decides the
precision_config of float32 dot_general / convolution: "highest" -> HIGHEST,
"high" -> HIGH (torch.backends.cuda.matmul.allow_tf32 = True means "high"),
"medium" -> DEFAULT (no attribute; one bfloat16 pass on TPU). Lower-precision
operands carry nothing; dots that stand for exact arithmetic inside an op
(multinomial's CDF, adaptive pooling) stay HIGHEST. The setting is part of
the op-plan and compiled-graph keys, so changing it between calls takes
effect at once. Checked in the programs torchtpu compiles
(TORCHTPU_DUMP_DIR), and results on the CPU plugin equal CPU PyTorch.
"""
from __future__ import annotations

import itertools
import os
import re

import pytest
import torch
import torch.nn.functional as F

import torchtpu

EXPECTED = {"highest": "HIGHEST", "high": "HIGH", "medium": None}
_shape = itertools.count(3)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


@pytest.fixture
def dump(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHTPU_DUMP_DIR", str(tmp_path))
    prev = torch.get_float32_matmul_precision()

    def programs(fn):
        # Strict mode compiles in background threads and a program is dumped
        # when its compile starts: let earlier compiles finish (and dump)
        # before clearing, or a late one lands in this call's programs.
        torch.tpu.synchronize()
        for p in tmp_path.iterdir():
            p.unlink()
        out = fn()
        torch.tpu.synchronize()
        return out, [p.read_text() for p in sorted(tmp_path.iterdir())]

    yield programs
    torch.set_float32_matmul_precision(prev)


def _ops_lines(texts, op):
    return [ln for t in texts for ln in t.splitlines() if f'"stablehlo.{op}"' in ln]


def _precisions(lines):
    out = set()
    for ln in lines:
        m = re.search(r"precision_config = \[#stablehlo<precision (\w+)>, #stablehlo<precision (\w+)>\]", ln)
        out.add(m.group(1) if m else None)
        if m:
            assert m.group(1) == m.group(2)
    return out


def _fresh(n=None):
    """A size no other test uses (this module counts from 314; the suite's shapes are small
    and round): the op compiles a new program, which TORCHTPU_DUMP_DIR sees. A size another
    test in the same xdist worker compiled earlier would be an in-memory cache hit and
    dump nothing."""
    return n or next(_shape) + 311


def _device_twice(fn, *cpu_args):
    """fn on tpu copies of the args, twice (the host tier runs a first sighting on the host)."""
    args = [a.to("tpu") for a in cpu_args]
    fn(*args)
    return fn(*args).cpu()


CASES = {
    "mm": (lambda a, b: a @ b, lambda k: (torch.randn(4, k), torch.randn(k, 6)), "dot_general"),
    "bmm": (torch.bmm, lambda k: (torch.randn(2, 4, k), torch.randn(2, k, 3)), "dot_general"),
    "linear": (lambda x, w: F.linear(x, w), lambda k: (torch.randn(3, k), torch.randn(5, k)), "dot_general"),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), lambda k: (torch.randn(2, 3, k), torch.randn(2, k, 4)),
               "dot_general"),
    "sdpa": (lambda q, k: F.scaled_dot_product_attention(q, k, k), lambda n: (torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)),
             "dot_general"),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), lambda k: (torch.randn(1, 2, k, k), torch.randn(3, 2, 3, 3)),
               "convolution"),
}


@pytest.mark.parametrize("setting", ["highest", "high", "medium"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_ops_carry_the_precision_torch_asks_for(dump, setting, case):
    fn, make, op = CASES[case]
    cpu_args = make(_fresh())
    torch.set_float32_matmul_precision(setting)
    out, texts = dump(lambda: _device_twice(fn, *cpu_args))
    lines = _ops_lines(texts, op)
    assert lines, f"no {op} in the programs of {case}"
    assert _precisions(lines) == {EXPECTED[setting]}
    # the CPU plugin computes float32 at full precision whatever the attribute (sums of ~300
    # products, in another order than CPU PyTorch's: float32 rounding at 1e-4)
    # (CPU PyTorch's oneDNN may use bfloat16 under "medium": the reference is "highest")
    torch.set_float32_matmul_precision("highest")
    torch.testing.assert_close(out, fn(*cpu_args), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lower_precision_operands_carry_no_precision(dump, dtype):
    k = _fresh()
    a, b = torch.randn(4, k, dtype=dtype), torch.randn(k, 4, dtype=dtype)
    torch.set_float32_matmul_precision("highest")
    out, texts = dump(lambda: _device_twice(torch.mm, a, b))
    lines = _ops_lines(texts, "dot_general")
    assert lines and _precisions(lines) == {None}
    torch.testing.assert_close(out, a @ b)


def test_allow_tf32_means_high(dump):
    k = _fresh()
    a, b = torch.randn(4, k), torch.randn(k, 4)
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert torch.get_float32_matmul_precision() == "high"
        _, texts = dump(lambda: _device_twice(torch.mm, a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert _precisions(_ops_lines(texts, "dot_general")) == {"HIGH"}


def test_exact_internal_dots_stay_highest(dump):
    torch.set_float32_matmul_precision("medium")
    n = _fresh()
    probs = torch.rand(3, n)
    x = torch.randn(1, 2, n, n)

    def run():
        p = probs.to("tpu")
        torch.multinomial(p, 2, replacement=True)
        xt = x.to("tpu")
        F.adaptive_avg_pool2d(xt, (3, 2))
        return torch.multinomial(p, 2, replacement=True), F.adaptive_avg_pool2d(xt, (3, 2)).cpu()

    (_, pooled), texts = dump(run)
    dots = _ops_lines(texts, "dot_general")
    assert dots and _precisions(dots) == {"HIGHEST"}
    torch.set_float32_matmul_precision("highest")
    torch.testing.assert_close(pooled, F.adaptive_avg_pool2d(x, (3, 2)))


def test_changing_the_setting_takes_effect_at_once_in_strict_plans(dump):
    k = _fresh()
    a, b = torch.randn(4, k).to("tpu"), torch.randn(k, 4).to("tpu")
    torch.set_float32_matmul_precision("highest")
    for _ in range(4):  # host tier, then a compiled program, then plan replays
        torch.mm(a, b)
    torch.set_float32_matmul_precision("medium")
    _, texts = dump(lambda: torch.mm(a, b))
    assert _precisions(_ops_lines(texts, "dot_general")) == {None}
    torch.set_float32_matmul_precision("highest")
    _, texts = dump(lambda: torch.mm(a, b))
    assert texts == []  # the HIGHEST program (and its plan) again: nothing new


def test_defer_and_fuse_regions(dump):
    k = _fresh()
    a, b = torch.randn(4, k), torch.randn(k, 4)
    torch.set_float32_matmul_precision("high")

    def run():
        with torchtpu.mode("defer_and_fuse"):
            x, y = a.to("tpu"), b.to("tpu")
            return ((x @ y).relu() @ y.t()).cpu()

    out, texts = dump(run)
    assert _precisions(_ops_lines(texts, "dot_general")) == {"HIGH"}
    torch.set_float32_matmul_precision("highest")
    torch.testing.assert_close(out, (a @ b).relu() @ b.t(), rtol=1e-4, atol=1e-4)


def test_compiled_graphs_follow_the_setting(dump):
    torch._dynamo.reset()
    k = _fresh()
    a, b = torch.randn(4, k).to("tpu"), torch.randn(k, 4).to("tpu")
    f = torch.compile(lambda x, y: torch.tanh(x @ y), backend="tpu")
    torch.set_float32_matmul_precision("medium")
    out, texts = dump(lambda: f(a, b).cpu())
    assert _precisions(_ops_lines(texts, "dot_general")) == {None}
    torch.set_float32_matmul_precision("highest")
    out2, texts = dump(lambda: f(a, b).cpu())
    assert _precisions(_ops_lines(texts, "dot_general")) == {"HIGHEST"}
    ref = torch.tanh(a.cpu() @ b.cpu())
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out2, ref, rtol=1e-4, atol=1e-4)
