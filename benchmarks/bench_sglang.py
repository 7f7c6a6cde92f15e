"""Offline serving with SGLang on tpu: eager and compiled decode steps, in torchtpu's strict and
defer_and_fuse modes, vs torchtpu's StaticGenerator on tpu, as ratios in one run.

    PYTHONPATH=$PWD /path/to/venv-sglang/bin/python benchmarks/bench_sglang.py \\
        [--concurrency 1 16 64] [--trials 3] [--new 32] [--prompt-len 12] [--configs ...] [--json out.json]

Needs SGLang 0.5.23 and torchtpu's SGLang plugin (docs/sglang.md: its own venv, torch 2.14.1).
The model is the tests' tiny Llama (tests/vllm/tiny.py: hidden 64, 2 layers, vocab 512, fp32),
saved to a temporary directory. For each configuration one ``sgl.Engine`` (SGLang's scheduler
in its own process, as always), ``max_running_requests`` = the largest concurrency; for each
concurrency c, c requests of ``--prompt-len`` random token ids (fresh ones every trial, so the
radix cache does not help) ask for ``--new`` greedy tokens (EOS ignored), all submitted at once
with ``async_generate(stream=True)``:

  * sglang_eager_strict / sglang_eager_fuse: ``--disable-cuda-graph``, the model's ops eager in
    torchtpu's strict / defer_and_fuse mode (TORCHTPU_MODE of the scheduler process);
  * sglang_compiled_fuse / sglang_compiled_strict: decode steps compiled per batch bucket
    (torchtpu/sglang/graph_runner.py), the rest of the step in that mode;
  * shared_prefix (sglang_eager_fuse's engine): c requests sharing a 96-token prefix with
    a distinct 8-token tail, first with a cold radix cache (after flush_cache) then warm;
  * static_tpu: ``torchtpu.generation.StaticGenerator`` (torch.compile backend "tpu", static cache,
    prompts padded to bucket 16) on the batch of c prompts, in this process;
  * ``--vllm-python PY``: benchmarks/bench_vllm.py in vLLM's venv (PY, with this checkout on
    PYTHONPATH built for its torch 2.13: run this script itself from an environment where
    torchtpu is pip-installed for torch 2.14.1, e.g. ``TORCHTPU_INSTALL=1 tools/install_sglang.sh``)
    with the same model, concurrencies, trials, prompt length and new tokens, right after the
    SGLang configurations: vLLM's eager and full-graph steps and its own StaticGenerator run.

Figures: output tokens/s = c * new / wall time; TTFT = median over the c requests of the time to
their first streamed chunk (static_tpu: the batch's first token on the host); programs/step =
device programs run in the scheduler process between consecutive decode steps (the step log,
TORCHTPU_SGLANG_STEP_LOG), median; compiles/request = XLA compiles in the scheduler during the
timed calls / requests. One untimed warm-up call per (configuration, c), then ``--trials`` timed
calls: median and spread (min-max). Thread settings printed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # a torchtpu on PYTHONPATH (built for this torch) first
    sys.path.append(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("TORCHTPU_MEMORY_LIMIT", "1G")
os.environ.setdefault("SGLANG_PLATFORM", "torchtpu")
for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DO_NOT_TRACK"):
    os.environ.setdefault(k, "1")

CONFIGS = {
    "sglang_eager_strict": ("strict", True),
    "sglang_eager_fuse": ("defer_and_fuse", True),
    "sglang_compiled_fuse": ("defer_and_fuse", False),
    "sglang_compiled_strict": ("strict", False),
}


def thread_settings() -> dict:
    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "TORCHTPU_XLA_THREADS": os.environ.get("TORCHTPU_XLA_THREADS")}


def read_log(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


async def _one(eng, ids, sp, t0):
    first = None
    n = 0
    async for chunk in await eng.async_generate(input_ids=ids, sampling_params=sp, stream=True):
        if first is None:
            first = time.perf_counter() - t0
        n = len(chunk.get("output_ids") or [])
    return first, n


def timed_call(eng, prompts, sp) -> tuple[float, list[float], int]:
    async def go():
        t0 = time.perf_counter()
        res = await asyncio.gather(*[_one(eng, p, sp, t0) for p in prompts])
        return time.perf_counter() - t0, res

    loop = asyncio.get_event_loop()
    wall, res = loop.run_until_complete(go())
    return wall, [r[0] for r in res], sum(r[1] for r in res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=12)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS) + ["static_tpu"])
    ap.add_argument("--vllm-python", help="vLLM venv's python: also run bench_vllm.py (see the docstring)")
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch
    import tiny

    print("threads:", json.dumps(thread_settings()), flush=True)
    d = tempfile.mkdtemp(prefix="bench-sglang-llama-")
    cpu_model, tok = tiny.make_llama(d)
    vocab = cpu_model.config.vocab_size
    rng = random.Random(0)
    c_max = max(args.concurrency)
    sp = {"max_new_tokens": args.new, "temperature": 0, "ignore_eos": True}
    results = {}

    def prompts(c, length=args.prompt_len):
        return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(c)]

    for cfg in args.configs:
        if cfg == "static_tpu":
            continue
        mode, eager = CONFIGS[cfg]
        log = tempfile.mktemp(prefix="steps-", suffix=".jsonl")
        os.environ["TORCHTPU_MODE"] = mode
        os.environ["TORCHTPU_SGLANG_STEP_LOG"] = log
        import sglang as sgl

        t0 = time.perf_counter()
        eng = sgl.Engine(model_path=d, dtype="float32", skip_tokenizer_init=True, disable_cuda_graph=eager,
                         max_running_requests=c_max, max_total_tokens=max(8192, c_max * 256),
                         cuda_graph_max_bs_decode=c_max, mem_fraction_static=0.6, random_seed=0,
                         disable_radix_cache=False, log_level="error")
        init = time.perf_counter() - t0
        results[cfg] = {"engine_init_s": init}
        for c in args.concurrency:
            timed_call(eng, prompts(c), sp)  # warm-up
            n0 = len(read_log(log))
            walls, ttfts, toks = [], [], []
            for _ in range(args.trials):
                wall, first, n = timed_call(eng, prompts(c), sp)
                walls.append(wall)
                ttfts.append(statistics.median(first))
                toks.append(n)
            recs = read_log(log)[n0:]
            steps = [b["executions"] - a["executions"] for a, b in zip(recs, recs[1:])
                     if a["mode"] == b["mode"] == "DECODE"]
            comp = recs[-1]["compiles"] - recs[0]["compiles"] if recs else None
            tps = [t / w for t, w in zip(toks, walls)]
            results[cfg][c] = {"tokens_per_s": summary(tps), "ttft_s": summary(ttfts),
                               "programs_per_step": statistics.median(steps) if steps else None,
                               "compiles_per_request": comp / (c * args.trials) if comp is not None else None}
            print(cfg, c, json.dumps(results[cfg][c]), flush=True)
        if cfg == "sglang_eager_fuse":
            shared = [rng.randrange(3, vocab) for _ in range(96)]
            for c in args.concurrency:
                ps = [shared + [rng.randrange(3, vocab) for _ in range(8)] for _ in range(c)]
                eng.flush_cache()
                cold, _, n_cold = timed_call(eng, ps, sp)
                warm = []
                for _ in range(args.trials):
                    ps2 = [shared + [rng.randrange(3, vocab) for _ in range(8)] for _ in range(c)]
                    w, _, n = timed_call(eng, ps2, sp)
                    warm.append(n / w)
                results.setdefault("shared_prefix", {})[c] = {"cold_tokens_per_s": n_cold / cold,
                                                               "warm_tokens_per_s": summary(warm)}
                print("shared_prefix", c, json.dumps(results["shared_prefix"][c]), flush=True)
        eng.shutdown()

    if "static_tpu" in args.configs:
        os.environ["TORCHTPU_MODE"] = "strict"
        import torchtpu  # noqa: F401
        from transformers import LlamaForCausalLM

        from torchtpu.generation import StaticGenerator

        model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval().to("tpu")
        gen = StaticGenerator(model, buckets=(16,), max_cache_len=16 + args.new)
        results["static_tpu"] = {}
        for c in args.concurrency:
            def call():
                ids = torch.tensor(prompts(c))
                t0 = time.perf_counter()
                gen.generate(ids.to("tpu"), max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                             eos_token_id=None, pad_token_id=tok.pad_token_id).cpu()
                return time.perf_counter() - t0
            call()
            walls = [call() for _ in range(args.trials)]
            results["static_tpu"][c] = {"tokens_per_s": summary([c * args.new / w for w in walls])}
            print("static_tpu", c, json.dumps(results["static_tpu"][c]), flush=True)

    if args.vllm_python:
        import subprocess

        out = tempfile.mktemp(suffix=".json")
        env = {k: v for k, v in os.environ.items() if k not in ("TORCHTPU_MODE", "TORCHTPU_SGLANG_STEP_LOG")}
        env["PYTHONPATH"] = ROOT
        subprocess.run([args.vllm_python, os.path.join(ROOT, "benchmarks", "bench_vllm.py"), "--concurrency",
                        *map(str, args.concurrency), "--trials", str(args.trials), "--new", str(args.new),
                        "--prompt-len", str(args.prompt_len), "--json", out], env=env, check=True)
        with open(out) as f:
            rep = json.load(f)
        for r in rep["results"]:
            c = r["concurrency"] if "concurrency" in r else r.get("c")
            for cfg in ("vllm_tpu", "vllm_compiled", "static_tpu"):
                results.setdefault("bench_vllm_" + cfg, {})[c] = {
                    "tokens_per_s": {"median": r[cfg]["tok_s"], "min": r[cfg]["tok_s_spread"][0],
                                     "max": r[cfg]["tok_s_spread"][1]},
                    "ttft_s": {"median": r[cfg]["ttft_ms"] / 1000}}
        for c in args.concurrency:
            sg = results.get("sglang_compiled_fuse", {}).get(c)
            vl = results.get("bench_vllm_vllm_compiled", {}).get(c)
            if sg and vl:
                print(f"c={c}: sglang_compiled_fuse / vllm_compiled tokens/s "
                      f"{sg['tokens_per_s']['median'] / vl['tokens_per_s']['median']:.2f}", flush=True)

    for ref in ("sglang_eager_strict", "static_tpu"):
        base = results.get(ref)
        if base is None:
            continue
        for cfg, r in results.items():
            if cfg == ref or cfg == "shared_prefix":
                continue
            ratios = {c: round(r[c]["tokens_per_s"]["median"] / base[c]["tokens_per_s"]["median"], 2)
                      for c in args.concurrency if c in r and c in base}
            print(f"{cfg}: tokens/s vs {ref} {ratios}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
