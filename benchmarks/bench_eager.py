"""Strict-mode eager benchmarks, measured as ratios against native CPU PyTorch
in the same process.

    python benchmarks/bench_eager.py [--steps 30] [--json out.json]

Reports:
  * per-op host overhead of a 1k-element add (tpu strict, with and without
    op plans, vs CPU eager), and where the host time of one op goes,
  * defer_and_fuse recording cost per op,
  * host time of one fused AdamW step (torch.optim.AdamW(fused=True)) over
    the GPT demo's parameters, with and without op plans,
  * compile time per op program (first call of a new op/shape),
  * GPT demo training step time on tpu vs CPU, split into host time (the
    step's Python call returns) and wait (reading the loss).

    python benchmarks/bench_eager.py --bounds-ab [--rounds 9] [--steps 200]

  * the cost of strict / defer_and_fuse's asynchronous index-bounds checks on
    the GPT step (loss read every step): each round runs the step in two fresh
    processes, checks on and off (TORCHTPU_BOUNDS_CHECKS=0), in turns, and
    reports the median ratio and its spread over rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus
from _report import report, settle, spread, thread_settings  # benchmarks/_report.py



def _timeit(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def op_overhead(n: int = 4000) -> dict:
    a_cpu, b_cpu = torch.randn(1000), torch.randn(1000)
    a, b = a_cpu.to("tpu"), b_cpu.to("tpu")
    out = {"cpu_add_us": _timeit(lambda: torch.add(a_cpu, b_cpu), n) * 1e6}
    for plans in (False, True):
        prev = torchtpu._C._set_op_plans(plans)
        tag = "plans" if plans else "no_plans"
        out[f"tpu_add_dispatch_us_{tag}"] = _timeit(lambda: torch.add(a, b), n) * 1e6
        torch.tpu.synchronize()
        torchtpu.reset_metrics()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.add(a, b)
        torch.tpu.synchronize()
        out[f"tpu_add_with_sync_us_{tag}"] = (time.perf_counter() - t0) / n * 1e6
        m = torchtpu.metrics()
        # of which: the PJRT execute call (argument handles, launch, result buffers)
        out[f"tpu_add_launch_us_{tag}"] = m["flush_host_seconds"]["launch"] / n * 1e6
        out[f"tpu_add_build_text_us_{tag}"] = m["flush_host_seconds"]["build_text"] / n * 1e6
        torchtpu._C._set_op_plans(prev)
    out["overhead_ratio"] = out["tpu_add_dispatch_us_plans"] / out["cpu_add_us"]
    out["plans_speedup"] = out["tpu_add_dispatch_us_no_plans"] / out["tpu_add_dispatch_us_plans"]
    return out


def defer_record(n_ops: int = 400, reps: int = 5) -> dict:
    """Host time to record one elementwise op in defer_and_fuse mode (the
    region is flushed outside the timed loop)."""
    b = torch.randn(1000, device="tpu")
    best = float("inf")
    with torchtpu.mode("defer_and_fuse"):
        for _ in range(reps + 1):
            y = torch.zeros(1000, device="tpu")
            t0 = time.perf_counter()
            for _ in range(n_ops):
                y = y + b
            dt = time.perf_counter() - t0
            y.cpu()
            best = min(best, dt)
    return {"defer_record_us_per_op": best / n_ops * 1e6}


def fused_adamw(n: int = 30) -> dict:
    """Host time of one fused AdamW step (no waiting) over the GPT demo's parameters."""
    model = make_model(GPTConfig()).to("tpu")
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=3e-3, fused=True)
    out = {"params": len(params)}
    for plans in (False, True):
        prev = torchtpu._C._set_op_plans(plans)
        times = []
        for i in range(n):
            opt.param_groups[0]["lr"] = 3e-3 * (1 - i / (2 * n))  # a scheduler: a new lr every step
            torch.tpu.synchronize()
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        torch.tpu.synchronize()
        out["host_ms_" + ("plans" if plans else "no_plans")] = statistics.median(times[3:]) * 1e3
        torchtpu._C._set_op_plans(prev)
    return out


def compile_time(n_ops: int = 8) -> dict:
    torchtpu.reset_metrics()
    base = 37 + (time.time_ns() // 1000) % 100000  # shapes no earlier run left in the persistent cache
    xs = [torch.randn(base + i, 5, device="tpu") for i in range(n_ops)]  # new shapes: new programs
    t0 = time.perf_counter()
    for x in xs:
        (x * 3.0 + 1.0).cpu()
    dt = time.perf_counter() - t0
    m = torchtpu.metrics()
    return {"compiles": m["compiles"], "compile_seconds": m["compile_seconds"],
            "ms_per_compile": 1000 * m["compile_seconds"] / max(1, m["compiles"]),
            "wall_seconds": dt}


def gpt_step(steps: int, batch: int = 8) -> dict:
    cfg = GPTConfig()
    corpus = synthetic_corpus(20000, cfg.vocab_size)
    out = {"batch": batch, "block_size": cfg.block_size}
    for device in ("cpu", "tpu"):
        model = make_model(cfg).to(device)
        step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
        times, host = [], []
        for x, y in batches(corpus, batch, cfg.block_size, steps):
            x, y = x.to(device), y.to(device)
            if device == "tpu":
                settle()  # the last step's optimizer programs (and compiles) finish untimed
            t0 = time.perf_counter()
            loss = step(x, y)
            t1 = time.perf_counter()
            loss.item()
            times.append(time.perf_counter() - t0)
            host.append(t1 - t0)
        out[f"{device}_first_step_ms"] = times[0] * 1000
        out[f"{device}_median_step_ms"] = statistics.median(times[steps // 3:]) * 1000
        out[f"{device}_median_host_ms"] = statistics.median(host[steps // 3:]) * 1000
        out[f"{device}_step_spread"] = spread(times[steps // 3:])
    out["tpu_median_wait_ms"] = out["tpu_median_step_ms"] - out["tpu_median_host_ms"]
    out["tpu_over_cpu_step_time"] = out["tpu_median_step_ms"] / out["cpu_median_step_ms"]
    torchtpu.reset_metrics()
    model = make_model(cfg).to("tpu")
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    for x, y in batches(corpus, batch, cfg.block_size, 2):
        step(x.to("tpu"), y.to("tpu")).item()
    m = torchtpu.metrics()
    out["programs_per_step"] = m["executions"] / 2
    out["plan_replays_per_step"] = m["plan_replays"] / 2
    out["cpu_fallbacks"] = m["cpu_fallbacks"]
    return out


def _gpt_step_ms(steps: int, batch: int = 8) -> float:
    """Median GPT training step (loss read every step) in the current mode, on tpu."""
    cfg = GPTConfig()
    corpus = synthetic_corpus(20000, cfg.vocab_size)
    model = make_model(cfg).to("tpu")
    step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
    times = []
    for x, y in batches(corpus, batch, cfg.block_size, steps):
        x, y = x.to("tpu"), y.to("tpu")
        t0 = time.perf_counter()
        step(x, y).item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[steps // 3:]) * 1000


def bounds_ab(rounds: int, steps: int) -> dict:
    import os
    import subprocess
    import sys

    out: dict = {}
    for mode in ("strict", "defer_and_fuse"):
        ratios, on_ms, off_ms = [], [], []
        for _ in range(rounds):
            ms = {}
            for checks in ("1", "0"):
                env = dict(os.environ, TORCHTPU_BOUNDS_CHECKS=checks, TORCHTPU_MODE=mode)
                r = subprocess.run([sys.executable, __file__, "--gpt-only", "--steps", str(steps)], env=env,
                                   capture_output=True, text=True, check=True)
                ms[checks] = float(r.stdout.strip().splitlines()[-1])
            on_ms.append(ms["1"])
            off_ms.append(ms["0"])
            ratios.append(ms["1"] / ms["0"])
        out[mode] = {"checks_on_ms": on_ms, "checks_off_ms": off_ms,
                     "on_over_off_median": round(statistics.median(ratios), 4),
                     "on_over_off_min": round(min(ratios), 4), "on_over_off_max": round(max(ratios), 4)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=None, help="30; 200 with --bounds-ab (shorter runs drown in noise)")
    ap.add_argument("--json")
    ap.add_argument("--bounds-ab", action="store_true", help="cost of the asynchronous bounds checks")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--gpt-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = 200 if args.bounds_ab else 30
    if args.gpt_only:
        print(_gpt_step_ms(args.steps))
        return
    if args.bounds_ab:
        report({"threads": thread_settings(), "bounds_checks": bounds_ab(args.rounds, args.steps)}, args.json)
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = {"threads": thread_settings(), "op_overhead": op_overhead(), "defer_record": defer_record(), "fused_adamw": fused_adamw(),
           "compile_time": compile_time(), "gpt_step": gpt_step(args.steps)}
    report(res, args.json)


if __name__ == "__main__":
    main()
