"""A few rows written into a large tensor (a KV-cache update): time per write.

    python benchmarks/bench_row_write.py [--repeat 5] [--json out.json]

index_copy_ / index_put_ of k rows (k = 1, 2, 8) into a [rows, 2, 32] float32
tensor of 1, 8 and 32 MB on tpu, and the same on CPU in this run. A write is
in place: its time should not grow with the destination's size. Before the
single-window fix (csrc/ops/common.cpp, AvoidSingleWindow) a one-row write on
the XLA:CPU plugin copied the whole destination (36 ms at 32 MB). Reports the
median and spread of `--repeat` trials of 50 writes each, and tpu/CPU ratios.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from _report import report, settle, spread, thread_settings  # benchmarks/_report.py

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import torch  # noqa: E402

import torchtpu  # noqa: E402,F401


def write(kv, idx, src, how):
    if how == "index_copy_":
        kv.index_copy_(0, idx, src)
    else:
        kv.index_put_((idx,), src)


def trial(kv, idx, src, how, n=50):
    sync = torch.tpu.synchronize if kv.device.type == "tpu" else (lambda: None)
    for _ in range(3):  # compile and warm
        write(kv, idx, src, how)
    sync()
    if kv.device.type == "tpu":
        settle()
    t = time.perf_counter()
    for _ in range(n):
        write(kv, idx, src, how)
    sync()
    return (time.perf_counter() - t) / n  # seconds per write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {"threads": thread_settings(), "ms_per_write": {}}
    for mb in (1, 8, 32):
        rows = mb * 2**20 // (2 * 32 * 4)
        for k in (1, 2, 8):
            for how in ("index_copy_", "index_put_"):
                per = {}
                for dev in ("cpu", "tpu"):
                    kv = torch.zeros(rows, 2, 32, device=dev)
                    idx = torch.arange(7, 7 + k, device=dev)
                    src = torch.randn(k, 2, 32, device=dev)
                    per[dev] = spread([trial(kv, idx, src, how) for _ in range(a.repeat)])
                key = f"{how} {k} row(s) into {mb} MB"
                t, c = per["tpu"]["median_ms"], per["cpu"]["median_ms"]
                res["ms_per_write"][key] = {**per, "tpu/cpu": round(t / c, 2) if c else None}
                print(f"{key:32s} tpu {t:.4f} ms  cpu {c:.4f} ms  tpu/cpu {t / c if c else float('nan'):.2f}x",
                      flush=True)
    report(res, a.json)


if __name__ == "__main__":
    main()
