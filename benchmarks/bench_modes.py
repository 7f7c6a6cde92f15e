"""Eager modes compared in one process: strict vs defer_and_fuse (and debug).

    python benchmarks/bench_modes.py [--steps 20] [--repeat 3] [--json out.json]

Reports:
  * GPT demo training step (forward, backward, AdamW) at batch 16 (bound by
    XLA:CPU compute on this machine) and batch 2 (bound by host dispatch, as on
    an accelerator): step and host time per mode with the loss read every
    step (loss.item()), the pipelined step time with the losses read once at
    the end, the defer/strict speed-ups of both, programs per step and the
    first-step (compile) time;
  * elementwise chain: 50 x (+1, *2, -1) on a 1M-element float tensor, then
    .cpu(): time per mode and the defer/strict speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

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


def gpt_train(mode: str, steps: int, batch: int = 16) -> dict:
    cfg = GPTConfig()
    corpus = synthetic_corpus(20000, cfg.vocab_size)
    with torchtpu.mode(mode):
        torch.tpu.synchronize()
        model = make_model(cfg).to("tpu")
        step = make_train_step(model, torch.optim.AdamW(model.parameters(), lr=3e-3))
        data = [(x.to("tpu"), y.to("tpu")) for x, y in batches(corpus, batch, cfg.block_size, steps)]
        torch.tpu.synchronize()
        times, host, programs, compiles, compile_s = [], [], [], [], []
        for x, y in data:
            m0 = torchtpu.metrics()
            t0 = time.perf_counter()
            loss = step(x, y)
            t1 = time.perf_counter()
            loss.item()
            times.append(time.perf_counter() - t0)
            host.append(t1 - t0)
            m1 = torchtpu.metrics()
            programs.append(m1["executions"] - m0["executions"])
            compiles.append(m1["compiles"] - m0["compiles"])
            compile_s.append(m1["compile_seconds"] - m0["compile_seconds"])
        # the same steps again, pipelined: losses kept and read once at the end
        # (a loop that logs every N steps); the host records step i+1 while
        # the device runs step i
        m0 = torchtpu.metrics()
        t0 = time.perf_counter()
        losses = [step(x, y) for x, y in data]
        losses[-1].item()
        pipelined = (time.perf_counter() - t0) / len(data)
        pipelined_compiles = torchtpu.metrics()["compiles"] - m0["compiles"]
    k = 3 if len(times) > 6 else 1
    return {"first_step_ms": times[0] * 1000, "first_step_compile_s": compile_s[0],
            "pipelined_ms": pipelined * 1000, "pipelined_compiles": pipelined_compiles,
            "first_two_steps_compile_s": compile_s[0] + compile_s[1],
            "step_ms": statistics.median(times[k:]) * 1000,
            # host time until the step's last op is recorded/dispatched (before loss.item())
            "host_ms": statistics.median(host[k:]) * 1000,
            "programs_per_step": programs[-1], "compiles_after_warmup": sum(compiles[3:]),
            "loss": loss.item()}


def elementwise_chain(mode: str, reps: int = 9) -> dict:
    base = torch.randn(1 << 20)
    with torchtpu.mode(mode):
        x0 = base.to("tpu")
        torch.tpu.synchronize()

        def run():
            x = x0
            for _ in range(50):
                x = x + 1
                x = x * 2
                x = x - 1
            return x.cpu()

        run()  # compile
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return {"ms": statistics.median(times) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs per mode (medians reported)")
    ap.add_argument("--batches", default="16,2",
                    help="GPT batch sizes; 16 is bound by XLA:CPU compute, 2 by host dispatch (as on an accelerator)")
    args = ap.parse_args()
    torch.manual_seed(0)
    res = {"chain": {}}
    for b in (int(v) for v in args.batches.split(",")):
        r = res[f"gpt_batch_{b}"] = {}
        # the modes alternate, --repeat times: this machine's noise hits both alike
        runs = {"strict": [], "defer_and_fuse": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(gpt_train(mode, args.steps, b))
        for mode, rs in runs.items():
            r[mode] = dict(rs[0])  # first-step figures: the cold run
            for key in ("step_ms", "host_ms", "pipelined_ms"):
                r[mode][key] = statistics.median(x[key] for x in rs)
        r["speedup_defer_vs_strict"] = r["strict"]["step_ms"] / r["defer_and_fuse"]["step_ms"]
        r["speedup_defer_vs_strict_pipelined"] = r["strict"]["pipelined_ms"] / r["defer_and_fuse"]["pipelined_ms"]
    chain = {"strict": [], "defer_and_fuse": []}
    for _ in range(args.repeat):
        for mode in chain:
            chain[mode].append(elementwise_chain(mode)["ms"])
    for mode, ms in chain.items():
        res["chain"][mode] = {"ms": statistics.median(ms)}
    res["chain"]["speedup_defer_vs_strict"] = res["chain"]["strict"]["ms"] / res["chain"]["defer_and_fuse"]["ms"]
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
