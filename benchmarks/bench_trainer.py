"""transformers.Trainer training steps on tpu against CPU, fp32 and bf16 mixed precision.

    python benchmarks/bench_trainer.py [--steps 20] [--warmup 5] [--rounds 2] [--threads N]
                                       [--modes strict defer_and_fuse] [--json out.json]

A tiny Llama built from its config (hidden 128, 2 layers, vocab 1000, untied
embeddings) trains on random tokens, batch 8 x 64, through ``Trainer.train()``
exactly as a user would run it: ``TrainingArguments(use_cpu=...)`` picks the
device (Trainer goes through accelerate, which finds "tpu" as the current
accelerator), AdamW, gradient clipping at 1.0, and ``bf16=True`` for mixed
precision (autocast on either device). A callback stamps the end of every
optimizer step, after ``torch.tpu.synchronize()`` on tpu so that a step's time
holds its device work; a step's time is the interval since the previous step's
end (forward, backward, clipping, optimizer step, zero_grad, the next batch).
The first ``--warmup`` steps of every run are left out; the figure is the median
of the rest over ``--rounds`` runs per device, CPU and tpu runs alternating in the
same process (one untimed CPU run first, so Python's one-time imports are in
neither). fp32 runs first, then bf16 (whose runs find fp32's programs compiled).

Compiles: ``torchtpu.metrics()["compiles"]``, read and reset at every step's end.
``compiles_warmup`` is the sum over the first tpu run's warm-up steps,
``compiles_after_warmup`` the sum over the steps after warm-up in all tpu runs, and
``compiles_per_step`` the first tpu run's, step by step after warm-up (strict mode
runs an op's first calls on the host, see docs/design.md "host tier", so programs
are still compiled in the first steps after the first one). Each eager mode
(``TORCHTPU_MODE``) runs in its own subprocess with an empty compile cache
(``TORCHTPU_CACHE_DIR``, a temp dir). ``ratio`` is tpu ms/step over CPU ms/step in
that process. ``loss_abs_diff``: the runs' mean training loss, tpu against CPU (the
same computation on both: the same seed, data and updates).
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
sys.path.insert(0, ROOT)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

VOCAB, BATCH, SEQ = 1000, 8, 64
MODES = ("strict", "defer_and_fuse")


def tiny_llama():
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg)


def make_data(n):
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.x = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": self.x[i], "labels": self.x[i]}

    return Tokens()


def train(device, bf16, steps, warmup, tmp):
    """One Trainer run; returns (step seconds after warm-up, compiles in warm-up, compiles in each step after,
    the run's mean training loss)."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import torchtpu

    stamps, compiles = [], []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            torchtpu.reset_metrics()
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            if device == "tpu":
                torch.tpu.synchronize()
            stamps.append(time.perf_counter())
            compiles.append(torchtpu.metrics()["compiles"])
            torchtpu.reset_metrics()

    args = TrainingArguments(tmp, per_device_train_batch_size=BATCH, max_steps=warmup + steps, learning_rate=1e-3,
                             max_grad_norm=1.0, use_cpu=device == "cpu", bf16=bf16, logging_strategy="no",
                             save_strategy="no", report_to=[], seed=0, disable_tqdm=True,
                             dataloader_num_workers=0)
    model = tiny_llama()
    t = Trainer(model=model, args=args, train_dataset=make_data(BATCH * (warmup + steps)), callbacks=[Clock()])
    loss = t.train().training_loss
    assert t.args.device.type == device and model.device.type == device
    times = [b - a for a, b in zip(stamps, stamps[1:])][warmup:]
    return times, sum(compiles[:warmup]), compiles[warmup:], loss


def child(steps, warmup, rounds, threads):
    import torch

    import torchtpu

    if threads:
        torch.set_num_threads(threads)
    out = {"mode": torchtpu.get_mode(), "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        train("cpu", False, 2, 1, tmp)  # untimed: imports, first-use costs
        for precision, bf16 in (("fp32", False), ("bf16", True)):
            times = {"cpu": [], "tpu": []}
            warm, after, loss = None, [], {}
            for _ in range(rounds):
                for device in ("cpu", "tpu"):
                    t, w, a, loss[device] = train(device, bf16, steps, warmup, tmp)
                    times[device] += t
                    if device == "tpu":
                        warm = w if warm is None else warm
                        after.append(a)
            cpu_ms, tpu_ms = (1e3 * statistics.median(times[d]) for d in ("cpu", "tpu"))
            out[precision] = dict(cpu_ms=round(cpu_ms, 2), tpu_ms=round(tpu_ms, 2), ratio=round(tpu_ms / cpu_ms, 2),
                                  compiles_warmup=warm, compiles_after_warmup=sum(map(sum, after)),
                                  compiles_per_step=after[0],
                                  loss_abs_diff=float(f"{abs(loss['tpu'] - loss['cpu']):.2g}"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of every run")
    ap.add_argument("--rounds", type=int, default=2, help="runs per device, CPU and tpu alternating")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads for CPU's ops (0: torch's default); 1 on a loaded machine, where "
                         "OpenMP's spinning makes CPU's steps erratic")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.steps, a.warmup, a.rounds, a.threads)))
        return
    res = {"model": "llama hidden 128, 2 layers, vocab 1000", "batch": [BATCH, SEQ], "steps": a.steps,
           "warmup": a.warmup, "rounds": a.rounds, "modes": {}}
    for mode in a.modes:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--steps", str(a.steps), "--warmup",
               str(a.warmup), "--rounds", str(a.rounds), "--threads", str(a.threads)]
        with tempfile.TemporaryDirectory(prefix="bench-trainer-cache-") as cache:
            env = dict(os.environ, TORCHTPU_MODE=mode, TORCHTPU_CACHE_DIR=cache,
                       PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            res["modes"][mode] = {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
            print(out.stderr[-4000:], file=sys.stderr)
            continue
        res["modes"][mode] = json.loads(out.stdout.strip().splitlines()[-1])
    from _report import report  # benchmarks/_report.py

    report(res, a.json)


if __name__ == "__main__":
    main()
