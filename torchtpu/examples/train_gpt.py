"""Demo: train a small GPT on the "tpu" device and compare with CPU.

    python -m torchtpu.examples.train_gpt --steps 300 [--compare-cpu] [--compile]
"""
from __future__ import annotations

import argparse
import time

import torch

import torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus


def train(device: str, steps: int, cfg: GPTConfig, batch: int, lr: float, log_every: int,
          verbose: bool = True, compile: bool = False) -> tuple[list[float], list[float]]:
    model = make_model(cfg, seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    train_step = make_train_step(model, opt, compile=compile)
    corpus = synthetic_corpus(20000, cfg.vocab_size)
    losses, times = [], []
    for step, (x, y) in enumerate(batches(corpus, batch, cfg.block_size, steps)):
        t0 = time.perf_counter()
        loss = train_step(x.to(device), y.to(device))
        lv = loss.item()  # host read: waits for the step
        times.append(time.perf_counter() - t0)
        losses.append(lv)
        if verbose and (step % log_every == 0 or step == steps - 1):
            print(f"[{device}] step {step:4d}  loss {lv:.4f}  step time {times[-1] * 1000:7.2f} ms",
                  flush=True)
    return losses, times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--compare-cpu", action="store_true", help="also train on CPU and compare losses")
    ap.add_argument("--compile", action="store_true",
                    help='torch.compile(backend="tpu") the model and the optimizer step')
    args = ap.parse_args(argv)
    cfg = GPTConfig()
    print(f"torchtpu {torchtpu.__version__}: device {torch.tpu.get_device_name()}, mode {torchtpu.get_mode()}")
    losses, times = train("tpu", args.steps, cfg, args.batch, args.lr, args.log_every, compile=args.compile)
    steady = sorted(times[len(times) // 2:])[len(times[len(times) // 2:]) // 2]
    print(f"first step {times[0] * 1000:.1f} ms (includes compiles), median steady step {steady * 1000:.2f} ms")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    m = torchtpu.metrics()
    print(f"compiles {m['compiles']} ({m['compile_seconds']:.2f} s), executions {m['executions']}, "
          f"cpu fallbacks: {m['cpu_fallbacks'] or 'none'}")
    ok = losses[-1] < losses[0] * 0.8
    if args.compare_cpu:
        cpu_losses, cpu_times = train("cpu", args.steps, cfg, args.batch, args.lr, args.log_every,
                                      verbose=False)
        diff = max(abs(a - b) for a, b in zip(losses, cpu_losses))
        cpu_steady = sorted(cpu_times[len(cpu_times) // 2:])[len(cpu_times[len(cpu_times) // 2:]) // 2]
        print(f"cpu: loss {cpu_losses[0]:.4f} -> {cpu_losses[-1]:.4f}, max |loss diff| {diff:.2e}, "
              f"median step {cpu_steady * 1000:.2f} ms (tpu/cpu step time {steady / cpu_steady:.2f}x)")
        ok = ok and diff < 5e-2
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
