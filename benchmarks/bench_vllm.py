"""Offline serving: vLLM on tpu (eager, piecewise-compiled and full-graph steps) vs torchtpu's
StaticGenerator on tpu vs Hugging Face CPU eager ``generate``, as ratios in one process.

    PYTHONPATH=$PWD /path/to/venv-vllm/bin/python benchmarks/bench_vllm.py \\
        [--model tiny|l4h256] [--concurrency 1 16 64] [--trials 3] [--new 16] [--prompt-len 12] \\
        [--json out.json]
    ... benchmarks/bench_vllm.py --spec [--model ...] [--concurrency 1 8] [--new 32] [--k 4]

``--spec``: speculative decoding instead (function ``spec_main``): vLLM's compiled full-graph
steps without speculation (plain) and with n-gram lookups, a draft model equal to the target
(every draft accepted: the upper bound), a smaller draft model (1 layer, hidden 32: random, so
nearly every draft rejected: the cost of drafting) and a random EAGLE head, each with ``--k``
draft tokens, on two workloads: repetitive prompts (a random 4-token phrase repeated) and random
prompts. Output tokens/s (median and min-max over the trials), mean accepted length (1 +
accepted drafts per verify step, from vLLM's per-request spec-decode metrics over the timed
calls), XLA compiles during the timed calls, and the ratio to plain. Each configuration has its
own engine; they take turns trial by trial after ``--spec-warmup`` untimed calls.

Needs vLLM 0.33 and torchtpu's vLLM plugin (docs/vllm.md: its own venv). The model is the
tests' tiny Llama (tests/vllm/tiny.py: hidden 64, 2 layers, vocab 512, fp32) or, with
``--model l4h256``, a 4-layer hidden-256 Llama (8 heads, 4 KV heads, MLP 512), saved to a
temporary directory. For each concurrency c, c requests of ``--prompt-len`` random token ids
(fresh ones every trial, prefix caching off) ask for ``--new`` greedy tokens (EOS ignored):

  * vllm_tpu: ``LLM.generate`` of the c requests in one call (continuous batching, enforce_eager;
    vLLM's in-process engine, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so torchtpu's metrics see
    the engine's compiles and programs); vllm_piecewise: compiled steps split at attention
    (``splitting_ops`` = vLLM's attention ops), attention and sampler eager between the pieces;
    vllm_compiled: compiled steps as the platform sets them by default, the whole model one
    program per token bucket with torchtpu's paged attention inside (each its own engine).
    TTFT is vLLM's own per-request ``first_token_latency`` (median over the c requests);
    programs/step = device programs run during a timed call / ``--new`` (the call's steps when
    all c requests fit one batch: one prefill step, then decode steps);
  * static_tpu: ``torchtpu.generation.StaticGenerator`` (torch.compile backend "tpu", static
    cache, prompts padded to bucket 16) on the batch of c prompts;
  * hf_cpu: ``model.generate`` on CPU, eager, the batch of c prompts.

For the two batched ``generate`` configurations TTFT is the time until the first new tokens of
the batch reach the host (a streamer). Throughput = c * new / wall time of the call. One
untimed warm-up call per (configuration, c) first, plus torchtpu's host-tier count for the tpu
configurations (strict mode compiles an op's new shapes at their third sighting; a cold
TORCHTPU_CACHE_DIR unless set), then ``--trials`` timed calls; figures are the median and the spread (min-max) of the
trials; compiles_per_request = XLA compiles during the timed calls / requests. The greedy tokens
of the first warm-up call are compared with hf_cpu's. vLLM lowers torch's intra-op threads
to 1 in its engine; hf_cpu runs with the count the process started with (both printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("TORCHTPU_MEMORY_LIMIT", "1G")
for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
    os.environ.setdefault(k, "1")
os.environ.pop("VLLM_TARGET_DEVICE", None)  # "cpu" would bypass platform plugins
if "TORCHTPU_CACHE_DIR" not in os.environ:  # a cold persistent cache: warm-up includes compiles
    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-bench-vllm-")

import torch  # noqa: E402

import torchtpu  # noqa: E402

CONFIGS = ("vllm_tpu", "vllm_piecewise", "vllm_compiled", "static_tpu", "hf_cpu")
VLLM_CONFIGS = CONFIGS[:3]


def make_l4h256(out_dir: str):
    """A 4-layer hidden-256 Llama (8 heads of 32, 4 KV heads, MLP 512) with the tests' tokenizer."""
    import tiny
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny.make_tokenizer(out_dir, 512)
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=False, torch_dtype="float32")
    model = tiny._random(LlamaForCausalLM, cfg, 0, std=0.08)
    model.save_pretrained(out_dir)
    return model, tok


def thread_settings() -> dict:
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS",
                                          "TORCHTPU_MODE", "TORCHTPU_PLUGIN", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu_count": os.cpu_count(), "affinity": affinity, "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(), "loadavg": load, "env": env}


class TokenTimes:
    """A generate streamer noting when each step's tokens reach the host."""

    def __init__(self):
        self.times = []

    def put(self, value):
        value.cpu()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("tiny", "l4h256"), default="tiny")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--new", type=int, default=16, help="new tokens per request")
    p.add_argument("--prompt-len", type=int, default=12)
    p.add_argument("--cpu-threads", type=int, default=0, help="torch threads for hf_cpu (0: as at start)")
    p.add_argument("--json", default=None)
    p.add_argument("--spec", action="store_true", help="the speculative-decoding section (spec_main)")
    p.add_argument("--k", type=int, default=4, help="--spec: draft tokens per step")
    p.add_argument("--spec-warmup", type=int, default=3, help="--spec: untimed calls per configuration")
    args = p.parse_args()
    if args.spec:
        return spec_main(args)
    assert args.prompt_len <= 16, "StaticGenerator's prompt bucket here is 16"
    t_start = time.perf_counter()

    import tiny
    from transformers import LlamaForCausalLM
    from vllm import LLM, SamplingParams
    from torchtpu.generation import StaticGenerator

    threads_before = thread_settings()
    print("threads at start:", json.dumps(threads_before), flush=True)
    d = tempfile.mkdtemp(prefix="bench-vllm-llama-")
    cpu_model, tok = tiny.make_llama(d) if args.model == "tiny" else make_l4h256(d)
    vocab = cpu_model.config.vocab_size
    static_model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval().to("tpu")
    gen = StaticGenerator(static_model, buckets=(16,), max_cache_len=16 + args.new)

    c_max = max(args.concurrency)
    t0 = time.perf_counter()
    llms, engine_init = {}, {}
    from vllm.config import CompilationConfig

    piecewise = {"splitting_ops": CompilationConfig._attention_ops + ["vllm::unified_kv_cache_update"]}
    for cfg, eager, cc in (("vllm_tpu", True, {}), ("vllm_piecewise", False, piecewise), ("vllm_compiled", False, {})):
        t0 = time.perf_counter()
        llms[cfg] = LLM(model=d, dtype="float32", enforce_eager=eager, max_model_len=16 + args.new + 16,
                        max_num_seqs=c_max, max_num_batched_tokens=max(256, c_max * args.prompt_len),
                        enable_prefix_caching=False, kv_cache_memory_bytes=64 << 20, disable_log_stats=False,
                        gpu_memory_utilization=0.3, seed=0, compilation_config=cc)
        engine_init[cfg] = round(time.perf_counter() - t0, 2)
    engine_init_s = engine_init["vllm_tpu"]
    sp = SamplingParams(temperature=0, max_tokens=args.new, ignore_eos=True)
    threads_after = thread_settings()
    print(f"vLLM engines up in {engine_init} s; threads now:", json.dumps(threads_after), flush=True)

    # vLLM sets torch's intra-op threads to 1 in the engine ("for serving"); hf_cpu runs with the
    # count this process started with (--cpu-threads overrides). The tpu configurations run on
    # torchtpu's XLA:CPU thread pool either way.
    engine_threads = torch.get_num_threads()
    cpu_threads = args.cpu_threads or threads_before["torch_threads"]
    print(f"hf_cpu runs with {cpu_threads} torch threads (engine: {engine_threads})", flush=True)
    # strict mode's host tier runs an op's new shapes on the host its first few sightings and
    # compiles them after: warm-up = 1 + that many calls per tpu configuration (bench_generate.py)
    host_runs = torchtpu._C._host_tier_runs()
    g = torch.Generator().manual_seed(0)

    def prompts(c):
        return torch.randint(3, vocab, (c, args.prompt_len), generator=g)

    def run(cfg, ids):
        """Returns (tokens [c, new], wall s, ttft s, compiles, device programs run)."""
        c = ids.shape[0]
        m0 = torchtpu.metrics()
        before = m0["compiles"]
        t = time.perf_counter()
        if cfg in llms:
            outs = llms[cfg].generate([{"prompt_token_ids": r} for r in ids.tolist()], sp, use_tqdm=False)
            wall = time.perf_counter() - t
            toks = [list(o.outputs[0].token_ids) for o in outs]
            ttft = statistics.median(o.metrics.first_token_latency for o in outs)
        else:
            tt = TokenTimes()
            kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, streamer=tt,
                      eos_token_id=None, pad_token_id=tok.pad_token_id)
            if cfg == "static_tpu":
                out = gen.generate(ids.to("tpu"), **kw).cpu()
            else:
                torch.set_num_threads(cpu_threads)  # vLLM lowered torch's threads to 1 at start-up
                try:
                    with torch.no_grad():
                        out = cpu_model.generate(ids, **kw)
                finally:
                    torch.set_num_threads(engine_threads)
            wall = time.perf_counter() - t
            toks = out[:, args.prompt_len:].tolist()
            ttft = tt.times[1] - t
        assert len(toks) == c and all(len(x) == args.new for x in toks), (cfg, [len(x) for x in toks])
        m1 = torchtpu.metrics()
        return toks, wall, ttft, m1["compiles"] - before, m1["executions"] - m0["executions"]

    report = {"plugin": torchtpu._plugin_kind, "new_tokens": args.new, "prompt_len": args.prompt_len,
              "trials": args.trials, "threads_start": threads_before, "threads_after_engine": threads_after,
              "engine_init_s": engine_init, "hf_cpu_threads": cpu_threads,
              "host_tier_runs": host_runs, "results": []}
    for c in args.concurrency:
        res = {"concurrency": c}
        warm_ids = prompts(c)
        warm = {}
        for cfg in CONFIGS:
            t = time.perf_counter()
            comp = 0
            for w in range(1 + (host_runs if cfg != "hf_cpu" else 0)):
                toks, _, _, n, _ = run(cfg, prompts(c) if w else warm_ids)
                comp += n
                warm.setdefault(cfg, toks)
            res[cfg] = {"warmup_s": round(time.perf_counter() - t, 2), "warmup_compiles": comp,
                        "warmup_requests": 1 + (host_runs if cfg != "hf_cpu" else 0),
                        "tok_s": [], "ttft_ms": [], "compiles": 0, "programs_per_step": []}
        res["tokens_equal_hf_cpu"] = {cfg: warm[cfg] == warm["hf_cpu"] for cfg in CONFIGS[:-1]}
        for _ in range(args.trials):
            ids = prompts(c)
            for cfg in CONFIGS:  # the configurations take turns, trial by trial
                _, wall, ttft, comp, progs = run(cfg, ids)
                res[cfg]["programs_per_step"].append(progs / args.new)
                res[cfg]["tok_s"].append(c * args.new / wall)
                res[cfg]["ttft_ms"].append(1e3 * ttft)
                res[cfg]["compiles"] += comp
        for cfg in CONFIGS:
            x = res[cfg]
            for k in ("tok_s", "ttft_ms", "programs_per_step"):
                v = x.pop(k)
                x[k] = round(statistics.median(v), 2)
                x[k + "_spread"] = [round(min(v), 2), round(max(v), 2)]
            x["compiles_per_request"] = round(x.pop("compiles") / (c * args.trials), 2)
        for cfg in CONFIGS[:-1]:
            res[f"{cfg}_tok_s_vs_hf_cpu"] = round(res[cfg]["tok_s"] / res["hf_cpu"]["tok_s"], 2)
            res[f"{cfg}_ttft_vs_hf_cpu"] = round(res[cfg]["ttft_ms"] / res["hf_cpu"]["ttft_ms"], 2)
        res["vllm_tpu_tok_s_vs_static_tpu"] = round(res["vllm_tpu"]["tok_s"] / res["static_tpu"]["tok_s"], 2)
        res["vllm_compiled_tok_s_vs_vllm_tpu"] = round(res["vllm_compiled"]["tok_s"] / res["vllm_tpu"]["tok_s"], 2)
        res["vllm_compiled_tok_s_vs_static_tpu"] = round(res["vllm_compiled"]["tok_s"] / res["static_tpu"]["tok_s"], 2)
        res["vllm_compiled_tok_s_vs_vllm_piecewise"] = round(res["vllm_compiled"]["tok_s"]
                                                             / res["vllm_piecewise"]["tok_s"], 2)
        report["results"].append(res)

        print(f"\nconcurrency {c}: greedy tokens equal to hf_cpu: {res['tokens_equal_hf_cpu']}")
        print(f"  {'config':14s} {'out tok/s':>10s} {'(min-max)':>17s} {'TTFT ms':>9s} {'(min-max)':>17s} "
              f"{'warm-up s':>9s} {'compiles/req':>12s} {'programs/step':>13s}")
        for cfg in CONFIGS:
            x = res[cfg]
            print(f"  {cfg:14s} {x['tok_s']:10.1f} {x['tok_s_spread'][0]:8.1f}-{x['tok_s_spread'][1]:<8.1f} "
                  f"{x['ttft_ms']:9.1f} {x['ttft_ms_spread'][0]:8.1f}-{x['ttft_ms_spread'][1]:<8.1f} "
                  f"{x['warmup_s']:9.2f} {x['compiles_per_request'] if cfg != 'hf_cpu' else '-':>12} "
                  f"{x['programs_per_step'] if cfg != 'hf_cpu' else '-':>13}")
        print(f"  ratios: tok/s vllm/hf_cpu {res['vllm_tpu_tok_s_vs_hf_cpu']}x, static/hf_cpu "
              f"{res['static_tpu_tok_s_vs_hf_cpu']}x, vllm/static {res['vllm_tpu_tok_s_vs_static_tpu']}x, "
              f"vllm compiled/eager {res['vllm_compiled_tok_s_vs_vllm_tpu']}x, "
              f"vllm compiled/static {res['vllm_compiled_tok_s_vs_static_tpu']}x, "
              f"vllm compiled/piecewise {res['vllm_compiled_tok_s_vs_vllm_piecewise']}x; "
              f"TTFT vllm/hf_cpu {res['vllm_tpu_ttft_vs_hf_cpu']}x, static/hf_cpu {res['static_tpu_ttft_vs_hf_cpu']}x",
              flush=True)
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    print(f"\ntotal {report['total_s']} s; load average at the end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # not through teardown of vLLM's engine threads (as tests/vllm/tiny.py)


def _spec_steps(outs) -> tuple[int, int]:
    """(verify steps, accepted draft tokens) over the requests, from vLLM's per-request
    spec-decode metrics (``per_request_spec_decode_metrics="summary"``: a histogram of accepted
    drafts per step). The Prometheus counters are no use here: each engine built in a process
    unregisters the previous engine's collectors."""
    steps = accepted = 0
    for o in outs:
        m = o.outputs[0].spec_decode_metrics
        if m is not None:
            steps += sum(m.histogram)
            accepted += sum(j * n for j, n in enumerate(m.histogram))
    return steps, accepted


def spec_main(args):
    """Speculative decoding: plain compiled steps vs n-gram, draft models and EAGLE (see the
    module docstring), all in one process, configurations taking turns trial by trial."""
    import tiny
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM, SamplingParams

    t_start = time.perf_counter()
    threads = thread_settings()
    print("threads at start:", json.dumps(threads), flush=True)
    d = tempfile.mkdtemp(prefix="bench-spec-llama-")
    cpu_model, tok = tiny.make_llama(d) if args.model == "tiny" else make_l4h256(d)
    vocab = cpu_model.config.vocab_size
    small = tempfile.mkdtemp(prefix="bench-spec-small-")
    tok.save_pretrained(small)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=False, torch_dtype="float32")
    tiny._random(LlamaForCausalLM, cfg, 3).save_pretrained(small)
    eagle = tiny.make_eagle(tempfile.mkdtemp(prefix="bench-spec-eagle-"), d)
    k = args.k
    specs = {"plain": None,
             "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
             "draft_same": {"method": "draft_model", "model": d, "num_speculative_tokens": k},
             "draft_small": {"method": "draft_model", "model": small, "num_speculative_tokens": k},
             "eagle": {"method": "eagle", "model": eagle, "num_speculative_tokens": k}}
    c_max = max(args.concurrency)
    plen = 16
    llms, init_s = {}, {}
    for name, spec in specs.items():
        t0 = time.perf_counter()
        llms[name] = LLM(model=d, dtype="float32", enforce_eager=False, max_model_len=plen + args.new + 16,
                         max_num_seqs=c_max, max_num_batched_tokens=max(256, c_max * (plen + k + 1)),
                         enable_prefix_caching=False, kv_cache_memory_bytes=64 << 20, disable_log_stats=False,
                         gpu_memory_utilization=0.3, seed=0, speculative_config=spec,
                         per_request_spec_decode_metrics="summary" if spec else "none")
        init_s[name] = round(time.perf_counter() - t0, 1)
    print(f"engines up in {init_s} s; threads now: {json.dumps(thread_settings())}", flush=True)
    sp = SamplingParams(temperature=0, max_tokens=args.new, ignore_eos=True)
    g = torch.Generator().manual_seed(0)

    def prompts(c, workload):
        if workload == "random":
            return torch.randint(3, vocab, (c, plen), generator=g).tolist()
        phrase = torch.randint(3, vocab, (c, 4), generator=g)
        return phrase.repeat(1, plen // 4).tolist()

    def run(name, ids):
        t = time.perf_counter()
        outs = llms[name].generate([{"prompt_token_ids": r} for r in ids], sp, use_tqdm=False)
        wall = time.perf_counter() - t
        return [list(o.outputs[0].token_ids) for o in outs], wall, *_spec_steps(outs)

    report = {"model": args.model, "k": k, "new_tokens": args.new, "prompt_len": plen, "trials": args.trials,
              "threads": threads, "engine_init_s": init_s, "results": []}
    for workload in ("repetitive", "random"):
        for c in args.concurrency:
            res = {"workload": workload, "concurrency": c}
            warm_ids = prompts(c, workload)
            ref = None
            for name in specs:  # warm-up: model programs are built at start-up; the eager
                m0 = torchtpu.metrics()["compiles"]  # parts see new shapes for a few calls
                toks, _, _, _ = run(name, warm_ids)
                for _ in range(args.spec_warmup):
                    run(name, prompts(c, workload))
                ref = toks if ref is None else ref
                res[name] = {"tokens_equal_plain": toks == ref, "warmup_compiles": torchtpu.metrics()["compiles"] - m0,
                             "tok_s": [], "steps": 0, "accepted": 0, "compiles": 0}
            for _ in range(args.trials):
                ids = prompts(c, workload)
                for name in specs:
                    m0 = torchtpu.metrics()["compiles"]
                    _, wall, st, ac = run(name, ids)
                    x = res[name]
                    x["tok_s"].append(c * args.new / wall)
                    x["steps"] += st
                    x["accepted"] += ac
                    x["compiles"] += torchtpu.metrics()["compiles"] - m0
            for name in specs:
                x = res[name]
                v = x.pop("tok_s")
                x["tok_s"] = round(statistics.median(v), 1)
                x["tok_s_spread"] = [round(min(v), 1), round(max(v), 1)]
                x["mean_accepted_len"] = round(1 + x["accepted"] / x["steps"], 2) if x["steps"] else None
                x["vs_plain"] = round(x["tok_s"] / res["plain"]["tok_s"], 2) if name != "plain" else 1.0
            report["results"].append(res)
            print(f"\n{workload} prompts, concurrency {c}, k={k}, {args.new} new tokens:")
            print(f"  {'config':12s} {'out tok/s':>10s} {'(min-max)':>17s} {'vs plain':>8s} {'accept len':>10s} "
                  f"{'compiles':>8s} {'= plain':>7s}")
            for name in specs:
                x = res[name]
                print(f"  {name:12s} {x['tok_s']:10.1f} {x['tok_s_spread'][0]:8.1f}-{x['tok_s_spread'][1]:<8.1f} "
                      f"{x['vs_plain']:8.2f} {str(x['mean_accepted_len']):>10s} {x['compiles']:8d} "
                      f"{str(x['tokens_equal_plain']):>7s}", flush=True)
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    print(f"\ntotal {report['total_s']} s; load average at the end: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
