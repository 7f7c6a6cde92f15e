"""Strict-mode eager benchmarks, measured as ratios against native CPU PyTorch
in the same process.

    python benchmarks/bench_eager.py [--steps 30] [--json out.json]

Reports:
  * per-op host overhead of a 1k-element add (tpu strict vs CPU eager),
  * compile time per op program (first call of a new op/shape),
  * GPT demo training step time on tpu vs CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus


def _timeit(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def op_overhead(n: int = 2000) -> dict:
    a_cpu, b_cpu = torch.randn(1000), torch.randn(1000)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    cpu = _timeit(lambda: torch.add(a_cpu, b_cpu), n)

    def tpu_add():
        torch.add(a, b)

    tpu_dispatch = _timeit(tpu_add, n)
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        c = torch.add(a, b)
    torch.tpu.synchronize()
    tpu_total = (time.perf_counter() - t0) / n
    return {"cpu_add_us": cpu * 1e6, "tpu_add_dispatch_us": tpu_dispatch * 1e6,
            "tpu_add_with_sync_us": tpu_total * 1e6, "overhead_ratio": tpu_dispatch / cpu}


def compile_time(n_ops: int = 8) -> dict:
    torchtpu.reset_metrics()
    xs = [torch.randn(37 + i, 5, device="tpu") for i in range(n_ops)]  # new shapes: new programs
    t0 = time.perf_counter()
    for x in xs:
        (x * 3.0 + 1.0).cpu()
    dt = time.perf_counter() - t0
    m = torchtpu.metrics()
    return {"compiles": m["compiles"], "compile_seconds": m["compile_seconds"],
            "ms_per_compile": 1000 * m["compile_seconds"] / max(1, m["compiles"]),
            "wall_seconds": dt}


def gpt_step(steps: int) -> dict:
    cfg = GPTConfig()
    corpus = synthetic_corpus(20000, cfg.vocab_size)
    out = {}
    for device in ("cpu", "tpu"):
        model = make_model(cfg).to(device)
        step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
        times = []
        for x, y in batches(corpus, 16, cfg.block_size, steps):
            t0 = time.perf_counter()
            step(x.to(device), y.to(device)).item()
            times.append(time.perf_counter() - t0)
        out[f"{device}_first_step_ms"] = times[0] * 1000
        out[f"{device}_median_step_ms"] = statistics.median(times[steps // 3:]) * 1000
    out["tpu_over_cpu_step_time"] = out["tpu_median_step_ms"] / out["cpu_median_step_ms"]
    torchtpu.reset_metrics()
    model = make_model(cfg).to("tpu")
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    for x, y in batches(corpus, 16, cfg.block_size, 2):
        step(x.to("tpu"), y.to("tpu")).item()
    m = torchtpu.metrics()
    out["programs_per_step"] = m["executions"] / 2
    out["cpu_fallbacks"] = m["cpu_fallbacks"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = {"op_overhead": op_overhead(), "compile_time": compile_time(), "gpt_step": gpt_step(args.steps)}
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
