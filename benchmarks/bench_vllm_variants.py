"""vLLM on tpu: quantized checkpoints and tensor parallelism against their plain baselines, as
ratios measured in one run (issue 27's table; docs/serving.md).

    PYTHONPATH=$PWD /path/to/venv-vllm/bin/python benchmarks/bench_vllm_variants.py \\
        [--rounds 3] [--concurrency 16] [--new 32] [--prompt-len 12] [--json out.json]

Pairs (baseline first), each a tiny model of tests/vllm/tiny.py saved to a temporary directory:

  * llama (hidden 128, 2 layers, 4 heads of 32, MLP 256) in bfloat16 vs the same weights as a
    fine-grained FP8 checkpoint (128x128 blocks), a compressed-tensors FP8 (per-channel)
    checkpoint and a compressed-tensors NVFP4 (W4A4) checkpoint;
  * gpt-oss (4 experts, top-2) with the MXFP4 checkpoint's experts dequantized to bfloat16 vs
    the MXFP4 checkpoint (experts packed on the device);
  * llama bfloat16 with tensor_parallel_size 1 vs 2 (two worker processes).

Every variant runs in a fresh process (vLLM's offline ``LLM``, enforce_eager, bfloat16, prefix
caching off): one untimed warm-up batch, then a timed batch of ``--concurrency`` requests of
``--prompt-len`` random token ids, ``--new`` greedy tokens each (EOS ignored); decode
throughput = requests x new tokens / wall time of ``generate``. The variants take turns,
round by round (``--rounds``); figures are the median and spread (min-max) over rounds.
Weight memory is what vLLM measures over the model's load (``torch.tpu.memory_allocated``,
its ``model_memory_usage``), from the worker (rank 0 for TP). Threads: each engine lowers
torch's intra-op threads to 1 (vLLM); XLA:CPU runs its own pool; the machine's load average
is printed at start and end.
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
TESTS = os.path.join(ROOT, "tests", "vllm")
sys.path.insert(0, TESTS)

PAIRS = [("llama_bf16", ["llama_fp8_block", "llama_fp8_channel", "llama_nvfp4"]),
         ("gpt_oss_bf16", ["gpt_oss_mxfp4"]),
         ("llama_tp1", ["llama_tp2"])]


def build(d: str) -> dict:
    """Checkpoints -> {variant: (path, extra LLM kwargs)}."""
    import tiny

    model, tok, _ = tiny.make_llama_fp8(os.path.join(d, "fp8_block"), "block")
    tiny.make_llama_fp8(os.path.join(d, "fp8_channel"), "channel")
    tiny.make_llama_nvfp4(os.path.join(d, "nvfp4"))
    oss, oss_tok, _ = tiny.make_gpt_oss_mxfp4(os.path.join(d, "mxfp4"))
    plain, oss_plain = os.path.join(d, "llama_plain"), os.path.join(d, "gpt_oss_plain")
    tiny.save_dequantized(model, tok, plain)
    tiny.save_dequantized(oss, oss_tok, oss_plain)
    return {"llama_bf16": (plain, {}), "llama_fp8_block": (os.path.join(d, "fp8_block"), {}),
            "llama_fp8_channel": (os.path.join(d, "fp8_channel"), {}),
            "llama_nvfp4": (os.path.join(d, "nvfp4"), {}),
            "gpt_oss_bf16": (oss_plain, {}), "gpt_oss_mxfp4": (os.path.join(d, "mxfp4"), {}),
            "llama_tp1": (plain, {}), "llama_tp2": (plain, {"tensor_parallel_size": 2})}


def worker(spec: dict) -> dict:
    """One engine: warm-up batch, timed batch; prints RESULT json."""
    import torch
    from vllm import LLM, SamplingParams

    import tiny

    c, new, plen = spec["concurrency"], spec["new"], spec["prompt_len"]
    llm = LLM(model=spec["model"], dtype="bfloat16", enforce_eager=True, max_model_len=plen + new + 16,
              max_num_seqs=c, max_num_batched_tokens=max(256, c * plen), enable_prefix_caching=False,
              kv_cache_memory_bytes=64 << 20, seed=0, **spec["kwargs"])
    sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    g = torch.Generator().manual_seed(spec["seed"])

    def batch():
        ids = torch.randint(3, 500, (c, plen), generator=g).tolist()
        return [{"prompt_token_ids": r} for r in ids]

    llm.generate(batch(), sp, use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate(batch(), sp, use_tqdm=False)
    wall = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == new for o in outs)
    rep = llm.collective_rpc(tiny._worker_report)[0]
    return {"tok_s": c * new / wall, "model_memory": rep["model_memory"],
            "weight_bytes_by_dtype": rep["weight_bytes_by_dtype"], "quant_methods": rep["quant_methods"]}


def run_variant(path, kwargs, args, seed, tmp) -> dict:
    spec = {"model": path, "kwargs": kwargs, "concurrency": args.concurrency, "new": args.new,
            "prompt_len": args.prompt_len, "seed": seed}
    f = os.path.join(tmp, "spec.json")
    with open(f, "w") as fh:
        json.dump(spec, fh)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCH_DEVICE_BACKEND_AUTOLOAD="0", VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", TORCHTPU_MEMORY_LIMIT="512M", VLLM_CACHE_ROOT=os.path.join(tmp, "vc"))
    env.pop("VLLM_TARGET_DEVICE", None)
    out = subprocess.run([sys.executable, __file__, "--worker", f], env=env, capture_output=True, text=True,
                         timeout=900, start_new_session=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"variant failed (rc={out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=12)
    p.add_argument("--only", nargs="*", default=None, help="variants to run (default: all)")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        with open(args.worker) as f:
            res = worker(json.load(f))
        print("RESULT " + json.dumps(res), flush=True)
        os._exit(0)  # not through vLLM's engine teardown (tests/vllm/tiny.py)

    t0 = time.perf_counter()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-vllm-variants-")
    variants = build(tmp)
    names = [n for base, others in PAIRS for n in [base, *others] if not args.only or n in args.only]
    runs = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            path, kwargs = variants[n]
            res = run_variant(path, kwargs, args, seed=r, tmp=tmp)
            runs[n].append(res)
            print(f"round {r} {n:18s} {res['tok_s']:8.1f} tok/s  model memory {res['model_memory'] / 2**20:7.3f} MiB",
                  flush=True)
    report = {"rounds": args.rounds, "concurrency": args.concurrency, "new": args.new,
              "prompt_len": args.prompt_len, "variants": {}}
    for n in names:
        tps = [x["tok_s"] for x in runs[n]]
        report["variants"][n] = {"tok_s": round(statistics.median(tps), 1),
                                 "tok_s_spread": [round(min(tps), 1), round(max(tps), 1)],
                                 "model_memory_mib": round(runs[n][0]["model_memory"] / 2**20, 3),
                                 "weight_mib_by_dtype": {k: round(v / 2**20, 4) for k, v in
                                                         runs[n][0]["weight_bytes_by_dtype"].items()},
                                 "quant_methods": runs[n][0]["quant_methods"]}
    print(f"\n{'variant':18s} {'tok/s':>8s} {'(min-max)':>15s} {'vs base':>8s} {'weights MiB':>11s} {'vs base':>8s}")
    for base, others in PAIRS:
        for n in [base, *others]:
            if n not in report["variants"]:
                continue
            v = report["variants"][n]
            b = report["variants"].get(base)
            rt = f"{v['tok_s'] / b['tok_s']:.2f}x" if b else "-"
            rm = f"{v['model_memory_mib'] / b['model_memory_mib']:.2f}x" if b else "-"
            v["tok_s_vs_base"] = rt
            v["memory_vs_base"] = rm
            print(f"{n:18s} {v['tok_s']:8.1f} {v['tok_s_spread'][0]:7.1f}-{v['tok_s_spread'][1]:<7.1f} {rt:>8s} "
                  f"{v['model_memory_mib']:11.3f} {rm:>8s}")
    print("\nweights by dtype (MiB, rank 0):")
    for n, v in report["variants"].items():
        print(f"  {n:18s} {v['weight_mib_by_dtype']}")
    report["total_s"] = round(time.perf_counter() - t0, 1)
    print(f"\ntotal {report['total_s']} s; load average at the end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
