"""torch.compile(backend="tpu") benchmarks (ratios measured in one run).

    python benchmarks/bench_compile.py [--steps 30] [--json out.json]

* GPT fine-tuning step: compiled (model and optimizer step; model only; model
  with a fused=True AdamW, one native optimizer op per step) vs
  strict eager tpu vs native CPU eager, at batch 16 (bound by XLA:CPU compute
  on this machine) and batch 2 (bound by host dispatch, as on an accelerator).
  The configurations run in one process, taking turns step by step.
* Cold vs warm start, each in a fresh process: seconds spent compiling and
  time to the end of the first step, with an empty vs a populated cache, for
  the fully compiled step and for the compiled model with the fused AdamW.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from _report import report  # benchmarks/_report.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEP = r"""
import time, json, statistics
t_start = time.perf_counter()
import torch, torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus

t_import = time.perf_counter()
cfg = GPTConfig()
corpus = synthetic_corpus(4000, cfg.vocab_size)
model = make_model(cfg).to(DEVICE)
# "model_fused": the compiled model with AdamW(fused=True), whose step is one
# native op (torch never traces fused optimizers)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True if COMPILED == "model_fused" else None)
if COMPILED in ("model", "model_fused"):
    fwd = torch.compile(model, backend="tpu")
    step = make_train_step(fwd, opt)
else:
    step = make_train_step(model, opt, compile=COMPILED == "full")
times, host = [], []
for x, y in batches(corpus, BATCH, cfg.block_size, STEPS):
    t0 = time.perf_counter()
    loss = step(x.to(DEVICE), y.to(DEVICE))
    t1 = time.perf_counter()
    loss.item()
    times.append(time.perf_counter() - t0)
    host.append(t1 - t0)
    if len(times) == 1:
        t_first = time.perf_counter()
tpu = DEVICE == "tpu"
m = torchtpu.metrics() if tpu else {"compiles": 0, "compile_seconds": 0.0, "executions": 0, "disk_cache_hits": 0}
k = len(times) // 3
print(json.dumps({"import_s": t_import - t_start, "first_step_end_s": t_first - t_start,
                  "first_step_s": times[0], "median_step_ms": 1000 * statistics.median(times[k:]),
                  "median_host_ms": 1000 * statistics.median(host[k:]),
                  "compiles": m["compiles"], "compile_seconds": m["compile_seconds"],
                  "disk_cache_hits": m["disk_cache_hits"],
                  "programs_per_step": m["executions"] / max(1, len(times)),
                  "graphs": m["compile"] if tpu else {}}))
"""


# All step configurations in one process, taking turns step by step: this
# machine's speed drifts by up to 2x over minutes, so configurations timed in
# separate processes are not comparable; interleaved, the drift hits all alike.
INTERLEAVED = r"""
import time, json, statistics
import torch, torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus
cfg = GPTConfig()
corpus = synthetic_corpus(4000, cfg.vocab_size)
data = list(batches(corpus, BATCH, cfg.block_size, STEPS))
base = make_model(cfg)
configs = {}
for name, dev, compiled in (("cpu_eager", "cpu", ""), ("tpu_strict", "tpu", ""),
                            ("tpu_compiled_model", "tpu", "model"),
                            ("tpu_compiled_model_fused_opt", "tpu", "model_fused"),
                            ("tpu_compiled", "tpu", "full")):
    model = make_model(cfg).to(dev)
    model.load_state_dict(base.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True if compiled == "model_fused" else None)
    if compiled in ("model", "model_fused"):
        step = make_train_step(torch.compile(model, backend="tpu"), opt)
    else:
        step = make_train_step(model, opt, compile=compiled == "full")
    batches_dev = [(x.to(dev), y.to(dev)) for x, y in data]
    configs[name] = dict(step=step, data=batches_dev, times=[], host=[], programs=0)
for i in range(STEPS):
    for name, c in configs.items():
        x, y = c["data"][i]
        e0 = torchtpu.metrics()["executions"]
        t0 = time.perf_counter()
        loss = c["step"](x, y)
        t1 = time.perf_counter()
        loss.item()
        c["times"].append(time.perf_counter() - t0)
        c["host"].append(t1 - t0)
        if i >= 3:
            c["programs"] += torchtpu.metrics()["executions"] - e0
k = max(3, STEPS // 3)
print(json.dumps({name: {"median_step_ms": 1000 * statistics.median(c["times"][k:]),
                         "median_host_ms": 1000 * statistics.median(c["host"][k:]),
                         "programs_per_step": c["programs"] / (STEPS - 3)} for name, c in configs.items()}))
"""


def _script(code: str, cache_dir: str) -> dict:
    """Runs a benchmark script in a fresh process; its last stdout line is JSON."""
    env = dict(os.environ, TORCHTPU_CACHE_DIR=cache_dir, TORCHTPU_MODE="strict",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-4000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(device: str, compiled: str, steps: int, cache_dir: str, batch: int) -> dict:
    """compiled: "" (eager), "model" (the model only), "model_fused" (the model, with a
    fused=True AdamW) or "full" (model and optimizer step)."""
    return _script(f"DEVICE={device!r}\nCOMPILED={compiled!r}\nSTEPS={steps}\nBATCH={batch}\n" + STEP, cache_dir)


def step_ratios(batch: int, steps: int, warm_dir: str) -> dict:
    res = _script(f"STEPS={steps}\nBATCH={batch}\n" + INTERLEAVED, warm_dir)
    c = res["tpu_compiled"]["median_step_ms"]
    res["ratios"] = {
        "compiled_speedup_vs_strict": res["tpu_strict"]["median_step_ms"] / c,
        "compiled_model_only_speedup_vs_strict": res["tpu_strict"]["median_step_ms"]
        / res["tpu_compiled_model"]["median_step_ms"],
        "compiled_model_fused_opt_speedup_vs_strict": res["tpu_strict"]["median_step_ms"]
        / res["tpu_compiled_model_fused_opt"]["median_step_ms"],
        "compiled_speedup_vs_cpu_eager": res["cpu_eager"]["median_step_ms"] / c,
        # host time of a compiled step over its wall time: near 1 = dispatch-bound,
        # small = the device (here XLA:CPU) bounds the step
        "compiled_host_fraction": res["tpu_compiled"]["median_host_ms"] / c,
    }
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batches", default="16,2",
                    help="batch sizes; 16 is bound by XLA:CPU compute, 2 by host dispatch (as on an accelerator)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    res = {}
    with tempfile.TemporaryDirectory() as warm_dir:
        for b in (int(v) for v in args.batches.split(",")):
            res[f"batch_{b}"] = step_ratios(b, args.steps, warm_dir)
        b = int(args.batches.split(",")[0])
        for name, compiled in (("start", "full"), ("start_model_fused_opt", "model_fused")):
            with tempfile.TemporaryDirectory() as cold_dir:
                cold = run("tpu", compiled, args.steps, cold_dir, b)
            run("tpu", compiled, 2, warm_dir, b)  # populate
            warm = run("tpu", compiled, args.steps, warm_dir, b)
            res[name] = {"cold": cold, "warm": warm,
                         "warm_compile_seconds_fraction": warm["compile_seconds"] / max(cold["compile_seconds"], 1e-9),
                         "warm_first_step_end_fraction": warm["first_step_end_s"] / cold["first_step_end_s"]}
    report(res, args.json)


if __name__ == "__main__":
    main()
