"""torch.compile(backend="tpu") benchmarks (ratios measured in one run).

    python benchmarks/bench_compile.py [--steps 30] [--json out.json]

* GPT fine-tuning step: compiled vs strict eager tpu vs native CPU eager.
* Cold vs warm start, each in a fresh process: seconds spent compiling and
  time to the end of the first step, with an empty vs a populated cache.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = r"""
import time, json
t_start = time.perf_counter()
import torch, torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, synthetic_corpus
t_import = time.perf_counter()
cfg = GPTConfig()
corpus = synthetic_corpus(4000, cfg.vocab_size)
model = make_model(cfg).to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
fwd = torch.compile(model, backend="tpu") if COMPILED else model
times = []
for x, y in batches(corpus, 16, cfg.block_size, STEPS):
    t0 = time.perf_counter()
    loss = fwd(x.to(DEVICE), y.to(DEVICE))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss.item()
    times.append(time.perf_counter() - t0)
    if len(times) == 1:
        t_first = time.perf_counter()
m = torchtpu.metrics() if DEVICE == "tpu" else {"compiles": 0, "compile_seconds": 0.0, "executions": 0,
                                                "disk_cache_hits": 0}
print(json.dumps({"import_s": t_import - t_start, "first_step_end_s": t_first - t_start,
                  "first_step_s": times[0], "median_step_ms": 1000 * statistics.median(times[len(times) // 3:]),
                  "compiles": m["compiles"], "compile_seconds": m["compile_seconds"],
                  "disk_cache_hits": m["disk_cache_hits"],
                  "programs_per_step": m["executions"] / max(1, len(times)),
                  "graphs": torchtpu.metrics()["compile"] if DEVICE == "tpu" else {}}))
"""


def run(device: str, compiled: bool, steps: int, cache_dir: str, mode: str = "strict") -> dict:
    env = dict(os.environ, TORCHTPU_CACHE_DIR=cache_dir, PYTHONPATH=ROOT, TORCHTPU_MODE=mode,
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    code = f"DEVICE={device!r}\nCOMPILED={compiled}\nSTEPS={steps}\nimport statistics\n" + STEP
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-4000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    res = {}
    with tempfile.TemporaryDirectory() as warm_dir:
        res["cpu_eager"] = run("cpu", False, args.steps, "")
        res["tpu_strict"] = run("tpu", False, args.steps, warm_dir)
        res["tpu_compiled_cold"] = run("tpu", True, args.steps, tempfile.mkdtemp())
        run("tpu", True, 2, warm_dir)  # populate
        res["tpu_compiled_warm"] = run("tpu", True, args.steps, warm_dir)
    c, w = res["tpu_compiled_cold"], res["tpu_compiled_warm"]
    res["ratios"] = {
        "compiled_speedup_vs_strict": res["tpu_strict"]["median_step_ms"] / w["median_step_ms"],
        "compiled_speedup_vs_cpu_eager": res["cpu_eager"]["median_step_ms"] / w["median_step_ms"],
        "warm_compile_seconds_fraction": w["compile_seconds"] / max(c["compile_seconds"], 1e-9),
        "warm_first_step_end_fraction": w["first_step_end_s"] / c["first_step_end_s"],
    }
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
