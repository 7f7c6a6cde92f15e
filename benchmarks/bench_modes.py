"""Eager modes compared in one process: strict vs defer_and_fuse (and debug).

    python benchmarks/bench_modes.py [--steps 30] [--repeat 3] [--json out.json]
    python benchmarks/bench_modes.py --busy 1 [--batches 8]   # on a shared host

The modes take turns step by step (and run by run for the chain and the
pipelined loops), so this machine's drifting speed hits every mode alike.

Reports:
  * GPT demo training step (forward, backward, AdamW) at batch 16 (bound by
    XLA:CPU compute on this machine) and batch 2 (bound by host dispatch, as on
    an accelerator): step and host time per mode with the loss read every
    step (loss.item()), the pipelined step time with the losses read once at
    the end, the defer/strict speed-ups of both, programs per step and the
    first-step (compile) time; also defer_and_fuse_chunk0, defer_and_fuse
    with each synced step one region (torchtpu.set_defer_chunk_ops(0)), to
    show what running the step in parts gains;
  * with --busy N: the GPT step (default batch 8, T64) measured idle and then
    while N other processes each keep a core busy (a data loader, a
    tokenizer, a second process per host), each mode in a fresh process with
    a cold compile cache, as a user runs it: the warm-up (--steps steps, loss
    read once at the end: compiles and loop detection), the same steps timed
    with the loss read once at the end (pipelined) and with the loss read
    every step; each mode's slowdown factor (busy / idle) and defer/strict in
    each phase;
  * elementwise chain: 50 x (+1, *2, -1) on a 1M-element float tensor, then
    .cpu(): time per mode and the defer/strict speed-up, measured twice: in
    this process after the GPT runs ("chain"; the allocator is warm, so
    strict's fresh 4 MB output per op costs no page faults) and in a fresh
    process of its own ("chain_fresh_process", `--chain-only`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from _report import report, settle, spread, thread_settings  # benchmarks/_report.py

# this checkout's torchtpu, not an installed one
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# a cold persistent cache: the first step's time includes its compiles
if "TORCHTPU_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-bench-modes-")

import torch  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus



class _ChunkOps:
    """Sets torchtpu.set_defer_chunk_ops for a block (None: leaves it)."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        if self.n is not None:
            self.prev = torchtpu.set_defer_chunk_ops(self.n)

    def __exit__(self, *exc):
        if self.n is not None:
            torchtpu.set_defer_chunk_ops(self.prev)


class GptRun:
    """One mode's GPT training run. Runs of several modes advance step by step
    in turn (interleaved), so this machine's drifting speed hits every mode
    alike; each step's wall time includes loss.item()."""

    def __init__(self, mode: str, steps: int, batch: int, chunk_ops: int | None = None, cfg: GPTConfig | None = None):
        cfg = cfg or GPTConfig()
        corpus = synthetic_corpus(20000, cfg.vocab_size)
        self.mode = mode
        # defer_and_fuse's parts per synced step (None: the default)
        self.chunk_ops = chunk_ops
        self.name = mode if chunk_ops is None else f"{mode}_chunk{chunk_ops}"
        with torchtpu.mode(mode):
            torch.tpu.synchronize()
            torch.manual_seed(0)
            model = make_model(cfg).to("tpu")
            self.step_fn = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
            self.data = [(x.to("tpu"), y.to("tpu")) for x, y in batches(corpus, batch, cfg.block_size, steps)]
            torch.tpu.synchronize()
        self.times, self.host, self.programs, self.compiles, self.compile_s = [], [], [], [], []
        self.pipelined, self.pipelined_compiles = [], 0

    def _settings(self):
        return torchtpu.mode(self.mode), _ChunkOps(self.chunk_ops)

    def step(self, i: int) -> None:
        x, y = self.data[i]
        mode, chunk = self._settings()
        with mode, chunk:
            settle()  # no earlier launch or compile lands inside this step's time
            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            loss = self.step_fn(x, y)
            t1 = time.perf_counter()
            self.loss = loss.item()
            self.times.append(time.perf_counter() - t0)
            self.host.append(t1 - t0)
            m1 = torchtpu.metrics()
        self.programs.append(m1["executions"] - m0["executions"])
        self.compiles.append(m1["compiles"] - m0["compiles"])
        self.compile_s.append(m1["compile_seconds"] - m0["compile_seconds"])

    def run_pipelined(self) -> None:
        # the same steps again, losses kept and read once at the end (a loop
        # that logs every N steps): the host records step i+1 while the device
        # runs step i
        mode, chunk = self._settings()
        with mode, chunk:
            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            losses = [self.step_fn(x, y) for x, y in self.data]
            losses[-1].item()
            self.pipelined.append((time.perf_counter() - t0) / len(self.data))
            self.pipelined_compiles += torchtpu.metrics()["compiles"] - m0["compiles"]

    def result(self) -> dict:
        k = 3 if len(self.times) > 6 else 1
        # steady state: the steps after the first k that compiled nothing
        steady = [t for t, c in zip(self.times[k:], self.compiles[k:]) if c == 0] or self.times[k:]
        return {"first_step_ms": self.times[0] * 1000, "first_step_compile_s": self.compile_s[0],
                "first_two_steps_compile_s": self.compile_s[0] + self.compile_s[1],
                # every compile of the run's synced steps (defer_and_fuse compiles a
                # synced step's parts once the loop is known, at step 2 or 3)
                "all_steps_compile_s": sum(self.compile_s),
                "step_ms": statistics.median(steady) * 1000,
                "step_spread": spread(steady),
                "steps_with_compiles_excluded": len(self.times[k:]) - len(steady) if steady is not self.times[k:] else 0,
                "pipelined_spread": spread(self.pipelined),
                # host time until the step's last op is recorded/dispatched (before loss.item())
                "host_ms": statistics.median(self.host[k:]) * 1000,
                "pipelined_ms": statistics.median(self.pipelined) * 1000,
                "pipelined_compiles": self.pipelined_compiles,
                "programs_per_step": self.programs[-1], "compiles_after_warmup": sum(self.compiles[3:]),
                "loss": self.loss}


def elementwise_chain(modes, reps: int) -> dict:
    """ms per run of the chain in each mode; the modes take turns run by run."""
    base = torch.randn(1 << 20)
    x0 = base.to("tpu")
    torch.tpu.synchronize()

    def run():
        x = x0
        for _ in range(50):
            x = x + 1
            x = x * 2
            x = x - 1
        return x.cpu()

    times = {m: [] for m in modes}
    for m in modes:
        with torchtpu.mode(m):
            run()  # compile
    for _ in range(reps):
        for m in modes:
            with torchtpu.mode(m):
                t0 = time.perf_counter()
                run()
                times[m].append(time.perf_counter() - t0)
    return {m: {"ms": statistics.median(t) * 1000} for m, t in times.items()}


def _chain(reps: int) -> dict:
    r = elementwise_chain(("strict", "defer_and_fuse"), reps)
    r["speedup_defer_vs_strict"] = r["strict"]["ms"] / r["defer_and_fuse"]["ms"]
    return r


def _busy_procs(n: int) -> list:
    import subprocess

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def busy_child(args) -> dict:
    """One mode's GPT run as a user writes it, in a fresh process with a cold
    compile cache: `--steps` steps with the loss read once at the end (the
    warm-up: compiles and loop detection included), then `--repeat` timed runs
    of the same steps, loss read once at the end, then synced steps (the loss
    read every step)."""
    mode = args.busy_child
    b = int(args.batches.split(",")[0])
    cfg = GPTConfig(block_size=args.block_size, n_layer=args.n_layer, n_embd=args.n_embd)
    run = GptRun(mode, args.steps, b, cfg=cfg)
    with torchtpu.mode(mode):
        m0 = torchtpu.metrics()
        t0 = time.perf_counter()
        losses = [run.step_fn(x, y) for x, y in run.data]
        losses[-1].item()
        warmup = time.perf_counter() - t0
        compiles = torchtpu.metrics()["compiles"] - m0["compiles"]
    for _ in range(args.repeat):
        run.run_pipelined()
    for i in range(min(args.steps, 12)):
        run.step(i)
    return {"warmup_s": warmup, "warmup_compiles": compiles, "pipelined_s": run.pipelined,
            "step_s": run.times[2:], "compiles_after_warmup": run.pipelined_compiles + sum(run.compiles)}


def busy_compare(args) -> dict:
    """Each mode in a fresh process (busy_child), idle and then beside
    args.busy busy processes."""
    import subprocess

    b = int(args.batches.split(",")[0])
    res = {"batch": b, "block_size": args.block_size, "n_layer": args.n_layer, "n_embd": args.n_embd,
           "steps": args.steps, "busy_processes": args.busy}
    for phase in ("idle", "busy"):
        procs = _busy_procs(args.busy) if phase == "busy" else []
        try:
            if procs:
                time.sleep(0.5)
            r = res[phase] = {}
            for mode in ("strict", "defer_and_fuse"):
                env = dict(os.environ)
                env.pop("TORCHTPU_CACHE_DIR", None)  # a cold cache of its own
                cmd = [sys.executable, os.path.abspath(__file__), "--busy-child", mode, "--steps", str(args.steps),
                       "--repeat", str(args.repeat), "--batches", str(b), "--block-size", str(args.block_size),
                       "--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd)]
                out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
                c = json.loads(out.strip().splitlines()[-1])
                r[mode] = {"warmup_s": round(c["warmup_s"], 3), "warmup_compiles": c["warmup_compiles"],
                           "compiles_after_warmup": c["compiles_after_warmup"],
                           "pipelined": spread(c["pipelined_s"]), "step": spread(c["step_s"])}
            for k in ("step", "pipelined"):
                r[f"speedup_defer_vs_strict_{k}"] = round(
                    r["strict"][k]["median_ms"] / r["defer_and_fuse"][k]["median_ms"], 3)
            r["speedup_defer_vs_strict_warmup"] = round(r["strict"]["warmup_s"] / r["defer_and_fuse"]["warmup_s"], 3)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    for m in ("strict", "defer_and_fuse"):
        for k in ("step", "pipelined"):
            res[f"slowdown_{m}_{k}"] = round(res["busy"][m][k]["median_ms"] / res["idle"][m][k]["median_ms"], 3)
        res[f"slowdown_{m}_warmup"] = round(res["busy"][m]["warmup_s"] / res["idle"][m]["warmup_s"], 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=3, help="alternating pipelined runs and chain runs per mode (medians reported)")
    ap.add_argument("--chain-only", action="store_true", help="only the elementwise chain (this process)")
    ap.add_argument("--batches", default="16,2",
                    help="GPT batch sizes; 16 is bound by XLA:CPU compute, 2 by host dispatch (as on an accelerator)")
    ap.add_argument("--busy", type=int, default=0,
                    help="only the GPT step, idle and then beside N busy processes (default batch 8)")
    ap.add_argument("--busy-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--block-size", type=int, default=64, help="--busy: the GPT's sequence length")
    ap.add_argument("--n-layer", type=int, default=2, help="--busy: the GPT's layers")
    ap.add_argument("--n-embd", type=int, default=64, help="--busy: the GPT's width")
    args = ap.parse_args()
    torch.manual_seed(0)
    res = {"threads": thread_settings()}
    if args.busy_child:
        print(json.dumps(busy_child(args)))
        return
    if args.busy:
        if args.batches == ap.get_default("batches"):
            args.batches = "8"
        res["busy"] = busy_compare(args)
        report(res, args.json)
        return
    if args.chain_only:
        print(json.dumps(_chain(9 * args.repeat)))
        return
    # the chain in a fresh process first, then (below) in this one after the GPT runs
    import subprocess

    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--chain-only", "--repeat", str(args.repeat)],
                         check=True, capture_output=True, text=True).stdout
    res["chain_fresh_process"] = json.loads(out.strip().splitlines()[-1])
    for b in (int(v) for v in args.batches.split(",")):
        r = res[f"gpt_batch_{b}"] = {}
        # defer_and_fuse_chunk0: each synced step one region (no parts), to
        # show what cutting the step into parts gains
        runs = [GptRun("strict", args.steps, b), GptRun("defer_and_fuse", args.steps, b),
                GptRun("defer_and_fuse", args.steps, b, chunk_ops=0)]
        for i in range(args.steps):
            for run in runs:
                run.step(i)
        for _ in range(args.repeat):
            for run in runs:
                run.run_pipelined()
        for run in runs:
            r[run.name] = run.result()
        r["speedup_defer_vs_strict"] = r["strict"]["step_ms"] / r["defer_and_fuse"]["step_ms"]
        r["speedup_defer_chunk0_vs_strict"] = r["strict"]["step_ms"] / r["defer_and_fuse_chunk0"]["step_ms"]
        r["speedup_defer_vs_strict_pipelined"] = r["strict"]["pipelined_ms"] / r["defer_and_fuse"]["pipelined_ms"]
    res["chain"] = _chain(9 * args.repeat)
    report(res, args.json)


if __name__ == "__main__":
    main()
