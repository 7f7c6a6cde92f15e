"""Varlen (packed-document) attention, forward and backward: the dense form against the tiled
form (flash attention's loops), and CPU PyTorch per document, in one run.

    python benchmarks/bench_attention.py [--repeat 5] [--json out.json]

torchtitan's "varlen" attention calls torch.nn.attention.varlen's ops, lowered in
csrc/ops/attention.cpp: dense below 2^26 scores (heads x tokens^2), tiled above. Each size
runs in a subprocess per form (TORCHTPU_FLASH_TILE=dense / 512 pick it); the CPU reference is
F.scaled_dot_product_attention per document (causal) with autograd, float32. Packed batches
of 4 rows of documents of 1/2 and 1/4 of the row (the shapes a pretraining batch has), 8 heads,
head dim 64. Reports median and spread of `--repeat` trials of one forward+backward each, the
peak device memory of the tpu step, and the ratios in this run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _report import report, spread, thread_settings  # benchmarks/_report.py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

H, D, ROWS = 8, 64, 4


def _lens(row: int) -> list[int]:
    return [row // 2, row // 4, row - row // 2 - row // 4] * ROWS


def _inputs(row: int, device: str):
    import torch

    g = torch.Generator().manual_seed(row)
    T = row * ROWS
    q, k, v, go = (torch.randn(T, H, D, generator=g) for _ in range(4))
    lens = _lens(row)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    return [t.to(device) for t in (q, k, v)], go.to(device), cu.to(device), lens


def _child(row: int, device: str, repeat: int) -> dict:
    import torch
    import torch.nn.functional as F

    import torchtpu  # noqa: F401

    (q, k, v), go, cu, lens = _inputs(row, device)
    fa = torch.ops.aten._flash_attention_forward

    def step():
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        if device == "cpu":
            outs, s = [], 0
            for n in lens:
                outs.append(F.scaled_dot_product_attention(qs[s:s + n].transpose(0, 1), ks[s:s + n].transpose(0, 1),
                                                           vs[s:s + n].transpose(0, 1), is_causal=True).transpose(0, 1))
                s += n
            o = torch.cat(outs)
        else:
            o = fa(qs, ks, vs, cu, cu, max(lens), max(lens), 0.0, True, False)[0]
        o.backward(go)
        return qs.grad.sum().item() + ks.grad.sum().item()

    step()  # compile
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"time": spread(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", default="1024,2048,4096", help="tokens per batch row")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        row, device = a.child.split(":")
        print("RESULT " + json.dumps(_child(int(row), device, a.repeat)))
        return
    res = {"threads": thread_settings(), "heads": H, "head_dim": D, "rows": ROWS, "sizes": {}}
    for row in (int(x) for x in a.rows.split(",")):
        entry = {"tokens": row * ROWS, "scores_per_head_dense": (row * ROWS) ** 2}
        for name, env, device in (("cpu_sdpa_per_document", {}, "cpu"), ("tpu_dense", {"TORCHTPU_FLASH_TILE": "dense"}, "tpu"),
                                  ("tpu_tiled", {"TORCHTPU_FLASH_TILE": "512"}, "tpu")):
            r = subprocess.run([sys.executable, __file__, "--child", f"{row}:{device}", "--repeat", str(a.repeat)],
                               env=dict(os.environ, **env), capture_output=True, text=True, timeout=1800)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            entry[name] = json.loads(line[-1][7:]) if line else {"error": (r.stderr or r.stdout)[-500:]}
        med = {k: entry[k].get("time", {}).get("median_ms") for k in ("cpu_sdpa_per_document", "tpu_dense", "tpu_tiled")}
        if all(med.values()):
            entry["tiled_over_dense_time"] = round(med["tpu_tiled"] / med["tpu_dense"], 3)
            entry["tiled_over_cpu_time"] = round(med["tpu_tiled"] / med["cpu_sdpa_per_document"], 3)
        res["sizes"][str(row)] = entry
    report(res, a.json)


if __name__ == "__main__":
    main()
