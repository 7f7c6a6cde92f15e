"""Cheaper compile options for eager ops keep every bit.

On XLA:CPU an eager op's program made only of ops that the legacy elemental
emitter compiles bit for bit as the fusion emitters do compiles without the
fusion emitters (Runtime::DefaultOptionsFor). Forcing the fusion emitters for
every program (TORCHTPU_XLA_OPTIONS) must not change any result."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OPS = r"""
import hashlib, json, torch, torchtpu
torch.manual_seed(0)
def special(n, dt):
    a = torch.randn(n, dtype=torch.float64) * 2
    u = torch.rand(n, dtype=torch.float64)
    a[u < 0.05] = 0; a[(u > 0.05) & (u < 0.06)] *= float("inf"); a[(u > 0.06) & (u < 0.07)] = float("nan")
    a[(u > 0.07) & (u < 0.12)] *= 1e4; a[(u > 0.12) & (u < 0.17)] *= 1e-4
    return a.to(dt)
F = torch.nn.functional
un = [torch.exp, torch.log, torch.tanh, torch.sigmoid, torch.sin, torch.cos, torch.rsqrt, torch.sqrt, torch.log1p,
      torch.expm1, torch.erf, torch.tan, torch.asinh, F.silu, F.gelu, lambda x: F.gelu(x, approximate="tanh"),
      torch.reciprocal, torch.floor, torch.round, torch.sign, lambda x: x.float(), lambda x: x.to(torch.bfloat16)]
bi = [torch.add, torch.div, torch.pow, torch.remainder, torch.maximum, lambda a, b: a * b + a,
      lambda a, b: torch.where(a > b, a.exp(), b)]
out = {}
for dt in (torch.float32, torch.bfloat16, torch.float16):
    a, b = special(999, dt).to("tpu"), special(999, dt).to("tpu")
    for i, f in enumerate(un):
        out[f"u{i}{dt}"] = hashlib.sha256(f(a).cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:12]
    for i, f in enumerate(bi):
        out[f"b{i}{dt}"] = hashlib.sha256(f(a, b).cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:12]
print(json.dumps(out))
"""


def test_eager_op_results_do_not_depend_on_the_cpu_emitter(pyrun):
    runs = []
    for opts in ("", "xla_cpu_use_fusion_emitters=true"):
        p = pyrun(OPS, env={"TORCHTPU_CACHE_DIR": tempfile.mkdtemp(prefix="tt-opts-"), "TORCHTPU_HOST_TIER": "0",
                            "TORCHTPU_XLA_OPTIONS": opts}, timeout=240)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert len(runs[0]) == 3 * 29
    assert runs[0] == runs[1], {k for k in runs[0] if runs[0][k] != runs[1][k]}


def test_compare_tool_finds_the_ops_left_out(tmp_path):
    # The evidence behind the choice: the tool flags erf (its approximation
    # differs between the emitters) and passes exp.
    code = r"""
import torch, torchtpu
x = torch.randn(300).to("tpu")
x.exp().cpu(); torch.erf(x).cpu()
"""
    env = dict(os.environ, TORCHTPU_DUMP_DIR=str(tmp_path), TORCHTPU_CACHE_DIR="", TORCHTPU_HOST_TIER="0",
               TORCHTPU_COMPILE_THREADS="0", PYTHONPATH=ROOT, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    out = tmp_path / "cmp.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "compare_compile_options.py"), str(tmp_path),
                        "--options", "xla_cpu_use_fusion_emitters=false", "--json", str(out)],
                       env=dict(env, TORCHTPU_DUMP_DIR=""), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    per_op = json.load(open(out))["per_op"]
    assert per_op["chlo.erf"][1] >= 1 or per_op.get("stablehlo.erf", [0, 0])[1] >= 1, per_op
    assert per_op["stablehlo.exponential"][1] == 0, per_op
