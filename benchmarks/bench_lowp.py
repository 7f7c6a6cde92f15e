"""Low-precision weights on tpu, compared in one process with bf16.

    python benchmarks/bench_lowp.py [--steps 20] [--json out.json]

Reports:
  * a tiny Llama (transformers; hidden 512, 4 layers, intermediate 1536) with
    its linear layers (lm_head excepted) in bf16, FP8 (float8_e4m3fn weights,
    row-wise scales, dynamic row-wise activations: torch._scaled_mm) and
    MXFP4 (e2m1 weights, e8m0 scales per 32, dequantized in the call):
    the linear weights' device bytes (torch.tpu.memory_allocated deltas),
    their ratio to bf16, the first decode step (compiles included) and the
    steady decode step (one token, no KV cache), in strict and
    defer_and_fuse modes, with the max logit difference to bf16;
  * matmuls (M x 2048) @ (2048 x 2048): bf16 mm, FP8 _scaled_mm,
    mx_matmul (MXFP4 x MXFP4) and nvfp4_matmul, time per call.
Variants take turns step by step, so drift in this machine's speed hits
every variant alike; figures to compare are the ratios.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
if "TORCHTPU_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-bench-lowp-")

import torch  # noqa: E402

import torchtpu  # noqa: E402
from _report import report  # noqa: E402  (benchmarks/_report.py)
from torchtpu import quant as Q  # noqa: E402


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def linear_bytes_on_device(model, fmt):
    """Device bytes of the (quantized) linear weights: allocated before/after moving them."""
    mods = [m for n, m in model.named_modules()
            if isinstance(m, (torch.nn.Linear, Q.QuantLinear)) and "lm_head" not in n]
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    for m in mods:
        m.to("tpu")
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated() - before


def timed(fn, sync):
    t = time.perf_counter()
    out = fn()
    sync(out)
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    res = {"model": {}, "matmul": {}}

    base = tiny_llama()
    models, first = {}, {}
    for fmt in ("bf16", "fp8", "mxfp4"):
        m = copy.deepcopy(base)
        if fmt != "bf16":
            Q.quantize_linears(m, fmt)
        res["model"][fmt] = {"linear_weight_bytes": linear_bytes_on_device(m, fmt)}
        models[fmt] = m.to("tpu")
    ids = torch.randint(0, 2048, (1, 1)).to("tpu")

    def step(m):
        with torch.no_grad():
            return m(ids, use_cache=False).logits

    def sync(out):
        out.cpu()

    for mode in ("strict", "defer_and_fuse"):
        times = {f: [] for f in models}
        with torchtpu.mode(mode):
            for f, m in models.items():
                first[(mode, f)], _ = timed(lambda: step(m), sync)
            for _ in range(args.steps):
                for f, m in models.items():
                    times[f].append(timed(lambda: step(m), sync)[0])
        for f in models:
            r = res["model"][f]
            r[f"first_step_s_{mode}"] = first[(mode, f)]
            r[f"step_ms_{mode}"] = 1e3 * statistics.median(times[f])
    ref = step(models["bf16"]).float().cpu()
    for f in models:
        r = res["model"][f]
        r["weight_bytes_vs_bf16"] = r["linear_weight_bytes"] / res["model"]["bf16"]["linear_weight_bytes"]
        for mode in ("strict", "defer_and_fuse"):
            r[f"step_vs_bf16_{mode}"] = r[f"step_ms_{mode}"] / res["model"]["bf16"][f"step_ms_{mode}"]
        r["max_logit_diff_vs_bf16"] = (step(models[f]).float().cpu() - ref).abs().max().item()
    torchtpu.reset_metrics()
    step(models["fp8"]).cpu()
    step(models["mxfp4"]).cpu()
    res["cpu_fallbacks_in_quantized_steps"] = torchtpu.metrics()["cpu_fallbacks"]

    K = N = 2048
    for M in (1, 64):
        x, w = torch.randn(M, K), torch.randn(N, K)
        xb, wb = x.bfloat16().to("tpu"), w.bfloat16().to("tpu")
        xq, xs = [t.to("tpu") for t in Q.quantize_fp8(x, rowwise=True)]
        wq, ws = [t.to("tpu") for t in Q.quantize_fp8(w, rowwise=True)]
        xm, xms = [t.to("tpu") for t in Q.quantize_mx(x)]
        wm, wms = [t.to("tpu") for t in Q.quantize_mx(w)]
        xn, xns = [t.to("tpu") for t in Q.quantize_nvfp4(x)]
        wn, wns = [t.to("tpu") for t in Q.quantize_nvfp4(w)]
        fns = {
            "bf16_mm": lambda: xb @ wb.T,
            "fp8_scaled_mm": lambda: Q.fp8_matmul(xq, xs, wq, ws),
            "mxfp4_mx_matmul": lambda: Q.mx_matmul(xm, xms, wm, wms),
            "nvfp4_matmul": lambda: Q.nvfp4_matmul(xn, xns, wn, wns),
        }
        times = {k: [] for k in fns}
        for k, fn in fns.items():
            timed(fn, sync)
        for _ in range(args.steps):
            for k, fn in fns.items():
                times[k].append(timed(fn, sync)[0])
        row = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        row.update({f"{k}_vs_bf16": row[k] / row["bf16_mm"] for k in fns})
        res["matmul"][f"M={M}"] = {k: round(v, 4) for k, v in row.items()}

    for f, r in res["model"].items():
        res["model"][f] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
    report(res, args.json)


if __name__ == "__main__":
    main()
