"""Compiling for Cloud TPU without one: libtpu's compile-only mode (issue 34).

torchtpu.aot compiles programs for a TPU topology through PJRT_Compile with
no client; TORCHTPU_TPU_CHECK compiles every program of a run for it too.
Needs libtpu (pip install 'torchtpu[tpu]'); skipped without it.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import torchtpu
import torchtpu.aot as aot

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"),
                                reason="libtpu is not installed (pip install 'torchtpu[tpu]')")

ENV = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1"}

ALL_REDUCE = """module @all_reduce {
  func.func public @main(%arg0: tensor<1024xf32>) -> tensor<1024xf32> {
    %0 = "stablehlo.all_reduce"(%arg0) ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = "stablehlo.add"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%s) : (tensor<f32>) -> ()
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>,
        channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>} : (tensor<1024xf32>) -> tensor<1024xf32>
    return %0 : tensor<1024xf32>
  }
}
"""


def _programs_of(fn):
    """The program texts fn's ops build (on this process's plugin)."""
    torchtpu._C._push_warmup()
    torchtpu._C._capture_programs_start()
    try:
        fn()
        torch.tpu.synchronize()
    finally:
        texts = torchtpu._C._capture_programs_stop()
        torchtpu._C._pop_warmup()
    return texts


def test_topologies_have_their_chips():
    one, four = aot.describe("v5e:1x1"), aot.describe("v5e:2x2")
    assert (one["num_devices"], four["num_devices"]) == (1, 4)
    assert one["platform_name"] == "tpu"
    # the plugin's StableHLO version is read, and admits what torchtpu writes
    version = tuple(int(x) for x in one["plugin_attributes"]["stablehlo_current_version"].split("."))
    assert version >= (1, 13, 3)


def test_bad_topology_and_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="topology must look like"):
        aot.compile_text(ALL_REDUCE, topology="v5e")
    with pytest.raises(RuntimeError, match="nosuchchip"):
        aot.describe("nosuchchip:2x2")
    with pytest.raises(ValueError, match="num_replicas"):
        aot.compile_text(ALL_REDUCE, num_replicas=0)


def test_all_reduce_over_four_chips_compiles_for_v5e_2x2():
    r = aot.compile_text(ALL_REDUCE, topology="v5e:2x2", num_replicas=4)
    assert r["ok"], r["error"]
    assert r["argument_bytes"] == r["output_bytes"] == 4096
    # more chips than the topology has: refused before libtpu (which would abort the process)
    r = aot.compile_text(ALL_REDUCE, topology="v5e:1x1", num_replicas=4)
    assert not r["ok"] and "needs 4 chips" in r["error"] and "has 1" in r["error"]


def test_memory_figures_follow_the_program():
    small = _programs_of(lambda: torch.randn(64, 64, device="tpu") @ torch.randn(64, 64, device="tpu"))
    big = _programs_of(lambda: torch.randn(1024, 1024, device="tpu") @ torch.randn(1024, 1024, device="tpu"))
    mm = lambda texts: [t for t in texts if "stablehlo.dot_general" in t][-1]  # noqa: E731
    rs, rb = aot.compile_text(mm(small)), aot.compile_text(mm(big))
    assert rs["ok"] and rb["ok"]
    assert rs["argument_bytes"] == 2 * 64 * 64 * 4 and rs["output_bytes"] == 64 * 64 * 4
    assert rb["argument_bytes"] == 2 * 1024 * 1024 * 4 and rb["output_bytes"] == 1024 * 1024 * 4


def test_lower_from_shapes_alone_matches_the_program_that_runs():
    """aot.lower traces meta tensors (nothing allocated) into the same program the device
    runs: the TPU compiler's figures agree, and sizes no machine here holds compile too."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def step(w, x):
        y = torch.nn.functional.gelu(x @ w).square().sum()
        return torch.autograd.grad(y, (w, x))

    meta = [torch.empty(s, device="meta", requires_grad=True) for s in ((256, 512), (64, 256))]
    text = aot.lower(step, *meta)
    r = aot.compile_text(text)
    assert r["ok"], r["error"]
    assert r["argument_bytes"] >= (256 * 512 + 64 * 256) * 4
    grads = (256 * 512 + 64 * 256) * 4
    assert grads <= r["output_bytes"] < grads + 4096  # the two gradients (and the result tuple)
    # the same function on real device tensors, compiled: the same figures
    real = [torch.randn(s, device="tpu", requires_grad=True) for s in ((256, 512), (64, 256))]
    got = aot.lower(step, *real)
    assert aot.compile_text(got)["output_bytes"] == r["output_bytes"]
    assert got.count('"stablehlo.dot_general"') == text.count('"stablehlo.dot_general"') >= 3
    # 64 GiB of f32 parameters on "tpu": fake tensors, never allocated
    with FakeTensorMode():
        huge = [torch.empty(s, device="tpu", requires_grad=True) for s in ((131072, 131072), (8, 131072))]
    big = aot.compile_text(aot.lower(step, *huge), "v5p:2x2x1")
    # the weight and its gradient: 128 GiB, more than a v5p chip's 95 GiB HBM
    assert not big["ok"] and "HBM" in big["error"], big
    with pytest.raises(Exception, match="no lowering|Unsupported"):
        aot.lower(lambda x: torch.ops.aten._local_scalar_dense(x.sum()), torch.empty(3, device="meta"))


def test_complex128_fft_does_not_compile_for_tpu_and_the_plugin_says_why():
    # built for the CPU plugin (no TPU target): libtpu refuses it
    texts = _programs_of(lambda: torch.fft.fft(torch.randn(8, dtype=torch.complex128).to("tpu")))
    fft = [t for t in texts if "stablehlo.fft" in t]
    assert fft
    r = aot.compile_text(fft[0])
    assert not r["ok"] and "FFT" in r["error"]


def test_memory_report_for_a_training_step():
    from torchtpu.examples.gpt import GPTConfig, make_model, make_train_step

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = make_model(cfg).to("tpu")
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size), device="tpu")
    step(x, x).item()  # AdamW creates its state in the first step
    loss, rep = aot.memory(lambda: step(x, x).item(), topology="v5e:1x1")
    assert loss == loss and rep.programs and not rep.failures
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert rep.live_peak_bytes >= 3 * params  # weights, grads, AdamW's two moments
    assert rep.fits is True and rep.hbm_bytes == 16 << 30
    assert "fits" in str(rep)
    # the same step again: the same programs (op plans would replay them unseen)
    _, rep2 = aot.memory(lambda: step(x, x).item(), topology="v5e:1x1")
    assert len(rep2.programs) == len(rep.programs)
    assert rep2.estimated_peak_bytes < 1 << 30


def test_memory_report_for_a_compiled_function():
    f = torch.compile(lambda a, b: torch.softmax(a @ b, -1).sum(0), backend="tpu")
    a, b = torch.randn(256, 128, device="tpu"), torch.randn(128, 512, device="tpu")
    f(a, b)
    out, rep = aot.memory(f, a, b, topology="v6e:2x2")
    torch.testing.assert_close(out.cpu(), torch.softmax(a.cpu() @ b.cpu(), -1).sum(0), rtol=1e-5, atol=1e-5)
    assert len(rep.programs) == 1 and rep.programs[0]["runs"] == 1  # one compiled graph, one program
    assert rep.programs[0]["argument_bytes"] >= (256 * 128 + 128 * 512) * 4
    assert rep.hbm_bytes == 32 << 30


def test_check_compiles_every_program_and_reports(pyrun):
    code = """
import torch, torchtpu, torchtpu.aot as aot
torchtpu.reset_metrics()
x = torch.randn(32, 32, device="tpu")
for _ in range(3):
    y = (x @ x).softmax(-1).sum()
print("value", y.item())
r = aot.check_report(wait=True)
m = torchtpu.metrics()["tpu_check"]
print("report", r["topology"], r["programs"], r["failures"], r["pending"], m["programs"], r["max_output_bytes"])
secs = [t for t, _ in r["slowest"]]
print("slowest", len(secs), secs == sorted(secs, reverse=True), all(t > 0 for t in secs),
      all("stablehlo" not in ops and ops for _, ops in r["slowest"]))
"""
    p = pyrun(code, env=dict(ENV, TORCHTPU_TPU_CHECK="v5e:1x1", TORCHTPU_HOST_TIER="0"), timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("report")][0].split()
    assert line[1] == "v5e:1x1" and int(line[2]) >= 3 and line[3] == "0" and line[4] == "0"
    assert int(line[5]) > 0
    slow = [ln for ln in p.stdout.splitlines() if ln.startswith("slowest")][0].split()
    assert slow[1] == str(min(5, int(line[2]))) and slow[2:] == ["True", "True", "True"], slow


def test_strict_check_raises_naming_the_topology_and_the_op(pyrun):
    code = """
import torch, torchtpu, torchtpu.aot as aot
x = torch.randn(8, dtype=torch.complex128).to("tpu")
try:
    torch.fft.fft(x).cpu()
except RuntimeError as e:
    print("op-error:", str(e).splitlines()[0])
# a program that reaches the compiler anyway fails the strict check by name
from torchtpu import _C
text = open(__import__("os").environ["FFT_PROGRAM"]).read()
try:
    _C._compile(text)
except RuntimeError as e:
    print("check-error:", str(e).splitlines()[0])
"""
    texts = _programs_of(lambda: torch.fft.fft(torch.randn(8, dtype=torch.complex128).to("tpu")))
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tt_fft_c128_{os.getpid()}.mlir")
    with open(path, "w") as f:
        f.write([t for t in texts if "stablehlo.fft" in t][0])
    try:
        p = pyrun(code, env=dict(ENV, TORCHTPU_TPU_CHECK="v5e:1x1", TORCHTPU_TPU_CHECK_STRICT="1", FFT_PROGRAM=path),
                  timeout=240)
    finally:
        os.unlink(path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "op-error: aten::_fft_c2c: a complex128 input does not compile for TPU" in p.stdout
    assert "check-error:" in p.stdout and "does not compile for TPU v5e:1x1" in p.stdout, p.stdout
