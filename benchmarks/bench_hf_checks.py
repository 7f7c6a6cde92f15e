"""transformers-style model checks on tpu against CPU, cold and warm compile cache.

    python benchmarks/bench_hf_checks.py [--models llama qwen2 gpt2 bert mixtral] [--json out.json]

A fixed, bounded battery in the style of transformers' ModelTesterMixin, on tiny
configs (hidden 32, 2 layers, vocab 99, as transformers' model testers build them):

  * build: the model from its config (seeded), moved to the device;
  * forward (no grad) at (batch, seq) = (2,7), (3,5), (1,13), (2,9);
  * forward + backward with labels at (2,7) and (3,5) (loss and every gradient);
  * attention-mask padding: left- and right-padded batches at (2,9);
  * output_hidden_states + output_attentions at (2,7);
  * save_pretrained + from_pretrained round trip (tmp dir), the reloaded model's
    forward compared with the original's (must be equal);
  * generate(): greedy, max_new_tokens=3, at (2,7) with a padding mask and (1,5)
    (decoder models only).

Each model's battery runs on CPU, then on tpu (strict eager), then on CPU again, in
one process; CPU's time is the mean of its two turns, and wall time per device is
summed over the models. One untimed CPU pass of every battery comes first, so that
neither figure holds Python's one-time costs (importing the modeling and generation
modules); the tpu figure holds everything else, compiles and disk-cache loads
included. The parent runs all this twice, each time in a fresh subprocess: "cold"
with a new, empty TORCHTPU_CACHE_DIR, "warm" with the same cache dir (programs load
from disk instead of compiling). For tpu it reports the split from
torchtpu.metrics(): compiles and compile seconds, disk-cache loads and their
seconds, host-tier ops, C++ and Python output-metadata rules, plan replays, CPU
fallbacks (by op). Compiles and disk loads run on the compile threads
(TORCHTPU_COMPILE_THREADS), so compile_s and disk_load_s are summed over those
threads; host_wait_s is the time the host itself spent blocked on programs
(compiling on its own thread, or waiting for queued launches and their
results), and other_s the tpu time left after it.
``digest`` hashes every tpu result (the bytes of each output, loss, gradient and
generated token), so a change to the backend can be checked to leave the results
bit-identical (the digests are the same cold and warm); ``max_abs_diff`` is tpu
against CPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MODELS = ("llama", "qwen2", "gpt2", "bert", "mixtral")
FWD_SHAPES = ((2, 7), (3, 5), (1, 13), (2, 9))
BWD_SHAPES = ((2, 7), (3, 5))
VOCAB = 99


def make_config(name):
    from transformers import AutoConfig

    common = dict(vocab_size=VOCAB, pad_token_id=0)
    if name == "gpt2":
        kw = dict(n_embd=32, n_layer=2, n_head=4, n_inner=37, n_positions=512, bos_token_id=98,
                  eos_token_id=98, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    elif name == "bert":
        kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  max_position_embeddings=512, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    else:
        kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=37, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
        if name == "mixtral":
            # intermediate 37 (the testers' size) makes CPU's torch._grouped_mm, transformers'
            # default expert path, refuse the strides ("multiple of 16 bytes"): 48 instead.
            kw.update(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)
    return AutoConfig.for_model(name, **common, **kw)


def model_class(name):
    import transformers

    return transformers.AutoModelForMaskedLM if name == "bert" else transformers.AutoModelForCausalLM


class Results:
    """Every result of a battery, in order: hashed (tpu) and kept (for the CPU comparison)."""

    def __init__(self):
        self.h = hashlib.sha256()
        self.tensors = []

    def add(self, t):
        import torch

        t = t.detach().cpu().contiguous()
        self.h.update(str((tuple(t.shape), t.dtype)).encode())
        self.h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        self.tensors.append(t)


def inputs(b, s, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (b, s), generator=g)


def battery(name, device, tmp):
    """The checks on one device; returns the Results."""
    import torch

    cls = model_class(name)
    cfg = make_config(name)
    res = Results()
    torch.manual_seed(0)
    model = cls.from_config(cfg).to(device).eval()

    with torch.no_grad():
        for i, (b, s) in enumerate(FWD_SHAPES):
            ids = inputs(b, s, i).to(device)
            res.add(model(input_ids=ids).logits)

    model.train()
    for i, (b, s) in enumerate(BWD_SHAPES):
        ids = inputs(b, s, 10 + i).to(device)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        res.add(out.loss)
        for p in model.parameters():
            if p.grad is not None:
                res.add(p.grad)
    model.eval()

    with torch.no_grad():
        ids = inputs(2, 9, 20)
        for side in ("left", "right"):
            mask = torch.ones_like(ids)
            if side == "left":
                mask[0, :3] = 0
            else:
                mask[0, -3:] = 0
            res.add(model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits)

        ids = inputs(2, 7, 30).to(device)
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
        for t in out.hidden_states + out.attentions:
            res.add(t)

        d = os.path.join(tmp, f"{name}-{device}")
        model.save_pretrained(d)
        back = cls.from_pretrained(d).to(device).eval()
        ids = inputs(2, 7, 40).to(device)
        a, b = model(input_ids=ids).logits, back(input_ids=ids).logits
        if not torch.equal(a, b):
            raise AssertionError(f"{name} on {device}: from_pretrained changed the outputs")
        res.add(b)

        if name != "bert":
            ids = inputs(2, 7, 50)
            mask = torch.ones_like(ids)
            mask[0, :2] = 0
            for ids, mask in ((ids, mask), (inputs(1, 5, 51), None)):
                kw = dict(attention_mask=mask.to(device)) if mask is not None else {}
                gen = model.generate(ids.to(device), max_new_tokens=3, do_sample=False, pad_token_id=0, **kw)
                res.add(gen)
    return res


SPLIT_KEYS = ("compiles", "compile_seconds", "cache_load_seconds", "cache_store_seconds", "disk_cache_hits",
              "host_wait_seconds", "queued_launches",
              "cache_hits", "executions", "native_executions", "plan_replays", "plans_recorded", "cpp_meta_rules")


def split_of(m):
    out = {k: m[k] for k in SPLIT_KEYS}
    out["host_tier_ops"] = sum(m["host_tier_ops"].values())
    out["python_meta_ops"] = dict(m["python_meta_ops"])
    out["cpu_fallbacks"] = dict(m["cpu_fallbacks"])
    return out


def child(models):
    import torch

    import torchtpu

    import transformers  # noqa: F401  (import time is not part of either device's figure)

    out = {"models": {}}
    with tempfile.TemporaryDirectory(prefix="bench-hf-checks-") as tmp:
        # Untimed: one CPU pass of every battery, so that neither device's figure holds
        # Python's one-time costs (importing each model's and generate()'s modules).
        t0 = time.perf_counter()
        for name in models:
            battery(name, "cpu", tmp)
        out["cpu_warmup_s"] = time.perf_counter() - t0
        for name in models:
            t0 = time.perf_counter()
            want = battery(name, "cpu", tmp)
            t_cpu = time.perf_counter() - t0
            torchtpu.reset_metrics()
            t0 = time.perf_counter()
            got = battery(name, "tpu", tmp)
            t_tpu = time.perf_counter() - t0
            m = torchtpu.metrics()
            # CPU again after tpu: its figure is the mean of the two turns around tpu's.
            t0 = time.perf_counter()
            again = battery(name, "cpu", tmp)
            t_cpu = (t_cpu + time.perf_counter() - t0) / 2
            assert again.h.hexdigest() == want.h.hexdigest()
            assert len(got.tensors) == len(want.tensors)
            diff = max(((a.double() - b.double()).abs().max().item() if a.numel() else 0.0)
                       for a, b in zip(got.tensors, want.tensors))
            split = split_of(m)
            # compiles and loads run on the compile threads (summed there); what the
            # host waited for them is host_wait_seconds
            split["other_s"] = t_tpu - m["host_wait_seconds"]
            out["models"][name] = dict(cpu_s=t_cpu, tpu_s=t_tpu, ratio=t_tpu / t_cpu, results=len(got.tensors),
                                       digest=got.h.hexdigest()[:16], max_abs_diff=diff, split=split)
            print(f"  {name}: cpu {t_cpu:.2f}s tpu {t_tpu:.2f}s ({t_tpu / t_cpu:.2f}x) "
                  f"compiles {m['compiles']} ({m['compile_seconds']:.2f}s) fallbacks {dict(m['cpu_fallbacks'])}",
                  file=sys.stderr, flush=True)
    return out


def total(run):
    ms = run["models"].values()
    cpu, tpu = sum(v["cpu_s"] for v in ms), sum(v["tpu_s"] for v in ms)
    split = {}
    for v in ms:
        for k, x in v["split"].items():
            if isinstance(x, dict):
                d = split.setdefault(k, {})
                for op, n in x.items():
                    d[op] = d.get(op, 0) + n
            else:
                split[k] = split.get(k, 0) + x
    return dict(cpu_s=cpu, tpu_s=tpu, ratio=tpu / cpu, split=split)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with open(args.out, "w") as f:
            json.dump(child(args.models), f)
        return

    from _report import report

    cache = tempfile.mkdtemp(prefix="torchtpu-bench-hf-checks-")
    res = {"models": args.models, "fwd_shapes": FWD_SHAPES, "bwd_shapes": BWD_SHAPES, "runs": {}}
    for phase in ("cold", "warm"):
        print(f"{phase} (TORCHTPU_CACHE_DIR={cache})", file=sys.stderr, flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            env = dict(os.environ, TORCHTPU_CACHE_DIR=cache)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--out", f.name,
                            "--models", *args.models], env=env, check=True)
            run = json.load(open(f.name))
        run["process_s"] = time.perf_counter() - t0
        run["total"] = total(run)
        res["runs"][phase] = run
    for phase, run in res["runs"].items():
        t = run["total"]
        res[f"ratio_{phase}"] = t["ratio"]
        res[f"summary_{phase}"] = dict(cpu_s=t["cpu_s"], tpu_s=t["tpu_s"], compiles=t["split"]["compiles"],
                                       compile_s=t["split"]["compile_seconds"],
                                       disk_loads=t["split"]["disk_cache_hits"],
                                       disk_load_s=t["split"]["cache_load_seconds"],
                                       host_wait_s=t["split"]["host_wait_seconds"],
                                       queued_launches=t["split"]["queued_launches"], other_s=t["split"]["other_s"],
                                       host_tier_ops=t["split"]["host_tier_ops"],
                                       plan_replays=t["split"]["plan_replays"],
                                       python_meta_ops=sum(t["split"]["python_meta_ops"].values()),
                                       cpu_fallbacks=t["split"]["cpu_fallbacks"])
    shutil.rmtree(cache, ignore_errors=True)
    digests = {p: {n: v["digest"] for n, v in r["models"].items()} for p, r in res["runs"].items()}
    res["digests_agree_cold_warm"] = digests["cold"] == digests["warm"]
    report(res, args.json)


if __name__ == "__main__":
    main()
