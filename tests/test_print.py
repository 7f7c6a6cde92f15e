"""Printing tpu tensors, and strict mode's host tier.

repr/str of a tpu tensor must read like the CPU tensor's, and cost about what
CPU printing costs: printing runs a few dozen small ops on shapes seen once
(slices, cat, abs, min/max, comparisons, masked_select). In strict mode such
an op whose program was never compiled runs on the host (bit-exact ops only)
the first times, instead of paying an XLA compile each.
"""
import re

import pytest
import torch

import torchtpu


def _norm(s):
    # torch wraps the device suffix by line width: compare without whitespace
    return re.sub(r"\s+", "", s).replace(",device='tpu:0'", "")


def _same_print(tpu_str, t):
    assert "device='tpu:0'" in tpu_str
    assert _norm(tpu_str) == _norm(repr(t)), (tpu_str, repr(t))


@pytest.mark.parametrize("make", [
    lambda: torch.randn(64, 64),
    lambda: torch.randn(5, 3) * 1e6,
    lambda: torch.tensor([1.0, float("nan"), float("inf"), -0.0, 1e-8]),
    lambda: torch.arange(2000).reshape(40, 50),
    lambda: torch.randn(3, 4) > 0,
    lambda: torch.randn(7).double(),
    lambda: torch.randn(4, 6).to(torch.bfloat16),
    lambda: torch.tensor(3.5),
    lambda: torch.zeros(0, 3),
], ids=["f32-summarized", "sci", "special", "int-summarized", "bool", "f64", "bf16", "0d", "empty"])
def test_repr_matches_cpu(make, host_tier):
    torch.manual_seed(0)
    t = make()
    _same_print(repr(t.to("tpu")), t)
    _same_print(str(t.to("tpu")), t)


def test_cold_print_compiles_nothing(pyrun):
    # A fresh process with an empty cache: printing compiles no program.
    code = """
import torch, torchtpu
t = torch.randn(61, 67, device="tpu") + 1
torch.tpu.synchronize()
torchtpu.reset_metrics()
s = repr(t)
m = torchtpu.metrics()
print(m["compiles"], sum(m["host_tier_ops"].values()), s == repr(t.cpu())[:-1] + ",\\n       device='tpu:0')")
"""
    r = pyrun(code, env={"TORCHTPU_CACHE_DIR": "", "TORCHTPU_HOST_TIER": None})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", r.stdout.split()[1], "True"] and int(r.stdout.split()[1]) > 10, r.stdout


# Edge values, padded to a length (37) no other test uses, so the programs are new here.
EDGE = torch.cat([torch.tensor([0.0, -0.0, 1.5, -2.5, float("inf"), float("-inf"), float("nan"), 1e-40, 3.0e38, 7.0]),
                  torch.linspace(-3, 3, 27)])


@pytest.mark.parametrize("op", [
    lambda x: x.abs(), lambda x: x.neg(), lambda x: x.ceil(), lambda x: x.floor(), lambda x: x.trunc(),
    lambda x: torch.cat([x, x.flip(0)]), lambda x: torch.stack([x, x * 2]), lambda x: x.max(), lambda x: x.amin(0),
    lambda x: x.ne(0), lambda x: x.eq(x.flip(0)), lambda x: x.gt(1.5) & x.lt(8), lambda x: x.isnan(),
    lambda x: x * x.flip(0), lambda x: x / x.flip(0), lambda x: x.double(), lambda x: x.double().float(),
    lambda x: torch.masked_select(x, x > 0), lambda x: x.nonzero(), lambda x: (x > 0).sum(),
    lambda x: torch.where(x > 0, x, x.flip(0)), lambda x: x.to(torch.bfloat16), lambda x: x.nan_to_num().clamp(-5, 5).int().double(),
], ids=lambda f: None)
def test_host_tier_and_compiled_program_give_the_same_bits(op, host_tier):
    # The first two runs of a new program take the host tier; the third
    # compiles it. All three must give the same bits: CPU PyTorch's, with
    # subnormals flushed as XLA:CPU flushes them (1e-40 here).
    x = EDGE.clone()
    torchtpu.reset_metrics()
    outs = [op(x.to("tpu")).cpu() for _ in range(3)]
    m = torchtpu.metrics()
    assert m["cpu_fallbacks"] == {}
    assert m["host_tier_ops"], m
    assert torch.set_flush_denormal(True)
    try:
        want = op(x)
    finally:
        torch.set_flush_denormal(False)

    def bits(t):  # exact bits (-0.0 differs from 0.0), NaN payloads aside
        if not t.dtype.is_floating_point:
            return t
        t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
        return t.reshape(-1).view(torch.uint8)

    for got in outs:
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(bits(got), bits(want)), (got, want)


def test_host_tier_off_and_large_inputs_compile(pyrun, host_tier):
    code = """
import torch, torchtpu
x = torch.arange(12.0, device="tpu").reshape(3, 4)
torchtpu.reset_metrics(); y = (x.abs() > 3).cpu()
m = torchtpu.metrics(); print(m["compiles"], sum(m["host_tier_ops"].values()))
"""
    r = pyrun(code, env={"TORCHTPU_HOST_TIER": "0", "TORCHTPU_CACHE_DIR": ""})
    assert r.returncode == 0, r.stderr
    compiles, host = map(int, r.stdout.split())
    assert compiles >= 1 and host == 0
    big = torch.randn(300, 300, device="tpu")  # 90000 elements: above the host tier's bound
    torchtpu.reset_metrics()
    big.abs().sum()
    assert "aten::abs" not in torchtpu.metrics()["host_tier_ops"]


def test_large_and_repeated_prints_read_only_what_they_show(pyrun):
    # Printing a large device-computed tensor reads the pages its printed
    # slices lie in (one small transfer each, kept as partial host copies),
    # compiles nothing, and printing it again reads nothing more.
    code = """
import re, torch, torchtpu
norm = lambda s: re.sub(r"\\s+", "", s).replace(",device='tpu:0'", "")
for shape in [(2048, 4096), (3, 200, 300), (5, 7, 9000)]:
    t = torch.randn(shape, device="tpu") * 3 + 1
    want = norm(repr(t.cpu()))
    torch.tpu.synchronize()
    for k in range(4):
        torchtpu.reset_metrics()
        s = repr(t)
        m = torchtpu.metrics()
        assert norm(s) == want, (s, want)
        print(shape, k, m["compiles"], m["bytes_device_to_host"], t.numel() * 4)
"""
    r = pyrun(code, env={"TORCHTPU_CACHE_DIR": "", "TORCHTPU_HOST_TIER": None})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 12, r.stdout
    for line in lines:
        k, compiles, d2h, nbytes = map(int, line.split(")")[1].split())
        assert compiles == 0, line
        assert d2h <= (256 << 10) and d2h < nbytes / 4, line
        if k > 0:
            assert d2h == 0, line


def test_view_reads_wait_for_pending_programs_and_follow_writes(host_tier):
    # Reads of slices of a large storage (partial host copies) see the value
    # of the program still running, and every later write.
    a = torch.randn(700, 700)
    x = a.to("tpu")
    y = x @ x  # still running when its slices are read
    want = a @ a
    assert torch.allclose(y[5, :7].cpu(), want[5, :7], rtol=1e-4, atol=1e-3)
    assert torch.allclose(y[-1, -3:].cpu(), want[-1, -3:], rtol=1e-4, atol=1e-3)
    assert y[5, 3].item() == y[5, :7].cpu()[3].item()
    y[5].zero_()  # a write through a view rebinds the storage: the host copies are stale
    assert torch.equal(y[5, :7].cpu(), torch.zeros(7))
    y.add_(1)
    assert torch.equal(y[5, :7].cpu(), torch.ones(7))
    assert torch.allclose(y[-1, -3:].cpu(), want[-1, -3:] + 1, rtol=1e-4, atol=1e-3)
    z = y[5, :4].double()  # a conversion of a value already on the host
    assert torch.equal(z.cpu(), torch.ones(4, dtype=torch.float64))


def test_host_tier_results_stay_on_the_host_until_a_program_needs_them(host_tier, metrics):
    # A host-tier result's bytes stay on the host (no upload) until a program
    # reads it or an in-place op donates its buffer; every reader sees the values.
    x = torch.linspace(-2, 2, 29)
    y = x.to("tpu").abs()  # host tier
    assert "aten::abs" in metrics()["host_tier_ops"]
    assert torch.equal(y.cpu(), x.abs())
    z = y.exp()  # a program reads it: uploaded then
    assert torch.allclose(z.cpu(), x.abs().exp())
    y.add_(1)  # in place: donates the uploaded buffer
    assert torch.equal(y.cpu(), x.abs() + 1)
    w = x.to("tpu").neg()
    w.mul_(torch.full((29,), 3.0, device="tpu"))  # in place on a never-uploaded buffer
    assert torch.equal(w.cpu(), -x * 3)
    assert torch.equal(torch.cat([w, y]).cpu(), torch.cat([-x * 3, x.abs() + 1]))
