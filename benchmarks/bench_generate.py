"""Decode speed of a tiny Llama's `generate`, tpu modes against CPU eager, in one process.

    python benchmarks/bench_generate.py [--new 32] [--repeat 3] [--batches 1 16] [--json out.json]

Configurations (greedy, no eos, prompts of 12 tokens):
  * cpu_eager: `model.generate` on the CPU (dynamic cache);
  * strict: `model.generate` on tpu in strict mode (dynamic cache);
  * defer_and_fuse: the same in defer_and_fuse mode;
  * compiled_static: torchtpu.generation.StaticGenerator (torch.compile
    backend="tpu", one fixed-size static cache, prompts padded to a bucket).

For each batch size the configurations take turns, request by request. A
streamer reads each step's tokens to the host as they come (as a streaming
server does): ttft_ms is the time to the first new token (prefill and one
sampling step), decode_tok_s = batch * (new - 1) / (time from the first to
the last new token), request_s the whole request. After the warm-up requests
per configuration (warmup_s: their compiles; 1 + TORCHTPU_HOST_TIER for tpu,
since strict mode's host tier compiles an op's new shapes at their third
sighting), the timed requests use fresh
prompts (and, for compiled_static, other prompt lengths in the same bucket);
compiles_per_request counts XLA compiles during them (0 = every program came
from the cache). Ratios are against strict eager and CPU eager.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
if "TORCHTPU_CACHE_DIR" not in os.environ:  # a cold persistent cache: warm-up includes compiles
    import tempfile

    os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-bench-generate-")

import torch  # noqa: E402

import torchtpu  # noqa: E402
from torchtpu.generation import StaticGenerator  # noqa: E402

CONFIGS = ("cpu_eager", "strict", "defer_and_fuse", "compiled_static")


def make_models(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=args.vocab,
                      max_position_embeddings=512, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    cpu = LlamaForCausalLM(cfg).eval()
    tpu = LlamaForCausalLM(cfg).eval()
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    static = LlamaForCausalLM(cfg).eval()
    static.load_state_dict(cpu.state_dict())
    static = static.to("tpu")
    return cpu, tpu, StaticGenerator(static, buckets=(16, 32), max_cache_len=32 + args.new)


class TokenTimes:
    """A generate streamer noting when each step's tokens reach the host (as a streaming
    server's detokenizer would read them): the prompt first, then one entry per new token."""

    def __init__(self):
        self.times = []

    def put(self, value):
        value.cpu()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def runner(name, cpu, tpu, gen):
    def run(ids, new, streamer=None):
        kw = dict(max_new_tokens=new, do_sample=False, streamer=streamer)
        if name == "cpu_eager":
            return cpu.generate(ids, **kw)
        ids = ids.to("tpu")
        if name == "compiled_static":
            out = gen.generate(ids, **kw)
        elif name == "defer_and_fuse":
            with torchtpu.mode("defer_and_fuse"):
                out = tpu.generate(ids, **kw)
        else:
            out = tpu.generate(ids, **kw)
        return out.cpu()

    return run


def bench_batch(batch, args, models):
    g = torch.Generator().manual_seed(batch)
    runs = {c: runner(c, *models) for c in CONFIGS}
    res = {c: {"ttft": [], "decode": [], "request": [], "compiles": []} for c in CONFIGS}
    outs = {}
    # Warm-up: compiles (and the reference tokens). Strict mode's host tier runs an
    # op with new shapes on the host its first HostTierRuns() times (generate's
    # growing-length ops see each length once per request) and compiles it the
    # next: the steady state begins after that many requests plus one.
    host_runs = torchtpu._C._host_tier_runs()
    for c in CONFIGS:
        t = time.perf_counter()
        for w in range(1 + (host_runs if c != "cpu_eager" else 0)):
            ids = torch.randint(1, args.vocab, (batch, 12), generator=torch.Generator().manual_seed(7 + w))
            # the timed requests' workload, streamer included: a streamer reads each
            # step's tokens (a flush per step in defer_and_fuse), which cuts its
            # regions where no streamer would not, so a warm-up without one compiled
            # other region programs (33 compiles per timed request before)
            out = runs[c](ids, args.new, TokenTimes())
            outs.setdefault(c, out)
        res[c]["warmup_s"] = time.perf_counter() - t
        res[c]["warmup_requests"] = 1 + (host_runs if c != "cpu_eager" else 0)
    same = all(torch.equal(outs[c], outs["cpu_eager"]) for c in CONFIGS)
    for r in range(args.repeat):
        length = 12 if r % 2 == 0 else 11  # compiled_static: another length, same bucket
        for c in CONFIGS:
            ids = torch.randint(1, args.vocab, (batch, length if c == "compiled_static" else 12), generator=g)
            torchtpu.reset_metrics()
            tt = TokenTimes()
            t = time.perf_counter()
            runs[c](ids, args.new, tt)
            end = time.perf_counter()
            assert len(tt.times) == args.new + 1
            res[c]["ttft"].append(tt.times[1] - t)
            res[c]["decode"].append(tt.times[-1] - tt.times[1])
            res[c]["request"].append(end - t)
            res[c]["compiles"].append(torchtpu.metrics()["compiles"])
    out = {"batch": batch, "tokens_equal_cpu": same}
    for c in CONFIGS:
        med = {k: statistics.median(res[c][k]) for k in ("ttft", "decode", "request")}
        out[c] = {"ttft_ms": round(1e3 * med["ttft"], 2),
                  "decode_tok_s": round(batch * (args.new - 1) / med["decode"], 1),
                  "request_s": round(med["request"], 4),
                  "warmup_s": round(res[c]["warmup_s"], 2), "warmup_requests": res[c]["warmup_requests"],
                  "compiles_per_request": max(res[c]["compiles"]) if c != "cpu_eager" else None}
    for c in CONFIGS[1:]:
        out[f"{c}_vs_strict"] = round(out[c]["decode_tok_s"] / out["strict"]["decode_tok_s"], 2)
        out[f"{c}_vs_cpu"] = round(out[c]["decode_tok_s"] / out["cpu_eager"]["decode_tok_s"], 2)
    return out


def bench_speculative(args, models):
    """Assisted generation (a draft: the target less its last layer) and prompt-lookup
    decoding against plain greedy on tpu (strict), warm: 1 + TORCHTPU_HOST_TIER untimed
    requests each first (every candidate length's programs compile there), then `repeat` timed requests of
    the same prompt (a repeated text, so prompt lookup finds candidates). Reports tokens
    per target forward (new tokens / target forwards: 1.0 without speculation),
    wall-time speed-up over plain greedy, compiles during the timed requests, and
    whether the tokens equal plain greedy's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cpu, tpu, _ = models
    host_runs = torchtpu._C._host_tier_runs()
    cfg = tpu.config.to_dict()
    cfg["num_hidden_layers"] = max(1, cfg["num_hidden_layers"] - 1)
    draft = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    last = f".layers.{tpu.config.num_hidden_layers - 1}."
    draft.load_state_dict({k: v for k, v in cpu.state_dict().items() if last not in k})
    draft = draft.to("tpu")
    base = torch.randint(3, args.vocab, (1, 8), generator=torch.Generator().manual_seed(7))
    ids = torch.cat([base, base, base], 1).to("tpu")
    calls = []
    hook = tpu.register_forward_hook(lambda *a: calls.append(1))
    kinds = {"greedy": {}, "assisted": {"assistant_model": draft}, "prompt_lookup": {"prompt_lookup_num_tokens": 3}}
    out, ref = {}, None
    try:
        for name, kw in kinds.items():
            for _ in range(1 + host_runs):  # warm-up, as in bench_batch
                tok = tpu.generate(ids, max_new_tokens=args.new, do_sample=False, **kw).cpu()
            ref = tok if ref is None else ref
            times = []
            torchtpu.reset_metrics()
            for _ in range(args.repeat):
                calls.clear()
                t0 = time.perf_counter()
                tok = tpu.generate(ids, max_new_tokens=args.new, do_sample=False, **kw).cpu()
                times.append(time.perf_counter() - t0)
            new = tok.shape[1] - ids.shape[1]
            out[name] = {"request_s": statistics.median(times), "target_forwards": len(calls),
                         "tokens_per_forward": round(new / len(calls), 2),
                         "compiles_timed": torchtpu.metrics()["compiles"], "tokens_equal_greedy": torch.equal(tok, ref)}
    finally:
        hook.remove()
    for name in ("assisted", "prompt_lookup"):
        out[name]["speedup_vs_greedy"] = round(out["greedy"]["request_s"] / out[name]["request_s"], 2)
    print(f"speculative decoding (strict, batch 1, {args.new} new tokens, warm):")
    for name, x in out.items():
        print(f"  {name:14s} {x['request_s'] * 1e3:8.1f} ms  target forwards {x['target_forwards']:3d}  "
              f"tokens/forward {x['tokens_per_forward']:5.2f}  speed-up {x.get('speedup_vs_greedy', 1.0):5.2f}x  "
              f"compiles {x['compiles_timed']}  equal to greedy {x['tokens_equal_greedy']}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--new", type=int, default=32, help="new tokens per request")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--json", default=None)
    p.add_argument("--speculative", action="store_true",
                   help="also: assisted (draft model) and prompt-lookup decoding vs plain greedy, strict mode")
    args = p.parse_args()
    models = make_models(args)
    report = {"plugin": torchtpu._plugin_kind, "new_tokens": args.new, "hidden": args.hidden,
              "layers": args.layers, "results": []}
    if args.speculative:
        report["speculative"] = bench_speculative(args, models)
    for b in args.batches:
        r = bench_batch(b, args, models)
        report["results"].append(r)
        print(f"batch {b}: tokens equal to CPU: {r['tokens_equal_cpu']}")
        print(f"  {'config':16s} {'decode tok/s':>12s} {'ttft ms':>9s} {'request s':>10s} {'warm-up s':>10s} "
              f"{'compiles/request':>16s}")
        for c in CONFIGS:
            x = r[c]
            print(f"  {c:16s} {x['decode_tok_s']:12.1f} {x['ttft_ms']:9.2f} {x['request_s']:10.4f} "
                  f"{x['warmup_s']:10.2f} {str(x['compiles_per_request']):>16s}")
        print("  decode vs strict: " + ", ".join(f"{c} {r[c + '_vs_strict']}x" for c in CONFIGS[1:])
              + " | vs cpu: " + ", ".join(f"{c} {r[c + '_vs_cpu']}x" for c in CONFIGS[1:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
