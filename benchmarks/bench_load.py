"""Peak host memory of ``from_pretrained(..., device_map="tpu")`` against the checkpoint's size.

    python benchmarks/bench_load.py [--mb 300] [--shard-mb 100] [--json out.json]

safetensors knows no "tpu" device, so transformers opens every shard on "cpu" (an
mmap of the file), takes each tensor from it and moves it with ``.to("tpu", dtype)``,
a few tensors at a time (its loader's thread pool). This measures how much host
memory that takes beyond the weights themselves: a Llama (hidden 768, vocab 8000,
untied embeddings, as many layers as make about ``--mb`` MB of fp32 weights) is
saved as sharded safetensors in a temp dir, then each case loads it in a fresh
subprocess:

  * ``tpu``: ``device_map="tpu"`` (fp32);
  * ``tpu-bf16``: ``device_map="tpu", dtype=torch.bfloat16``;
  * ``cpu``: ``device_map="cpu"``, for reference (its parameters are views of the
    mmapped files, so they are page cache, not anonymous memory: its resident_mb
    is 0 and peak_rss_mb shows the pages read);
  * ``tpu-no-mmap``: ``device_map="tpu", disable_mmap=True``, the control: transformers
    then reads every file into memory and builds the whole state dict on the host
    before moving it, the two host copies the measurement is there to catch.

The child starts the device first (so the plugin's own memory is in the baseline),
and loads a small model of the same architecture the same way (the modules
from_pretrained imports on first use hold ~130 MB for good), then samples its
/proc/self/status every millisecond during ``from_pretrained``:
``peak_anon_mb`` is the highest anonymous resident memory (RssAnon) above the
baseline, and ``peak_rss_mb`` the kernel's exact high-water mark (VmHWM, reset with
/proc/self/clear_refs) above the baseline, which also counts the checkpoint's
file pages mapped while reading (page cache, not a copy). With the XLA CPU plugin
the "device" is host memory too, so the model's resident bytes
(``torch.tpu.memory_allocated()``; 0 on CPU, see above) are taken off: ``overhead_mb = peak_anon_mb - resident_mb`` is what loading held on the host
beyond the loaded model, and ``overhead_x`` that against the checkpoint's size on
disk. Two full host copies of the weights would show as ``overhead_x`` >= 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CASES = {"tpu": dict(device_map="tpu"), "tpu-bf16": dict(device_map="tpu", dtype="bfloat16"),
         "cpu": dict(device_map="cpu"), "tpu-no-mmap": dict(device_map="tpu", disable_mmap=True)}
MB = 1 << 20


def config_for(mb):
    """A Llama (hidden 768, vocab 8000, untied) with as many layers as make its fp32 weights about ``mb`` MB."""
    from transformers import LlamaConfig

    hidden, inter, vocab = 768, 2048, 8000
    per_layer = 4 * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden)
    layers = max(1, round((mb * MB - 4 * (2 * vocab * hidden + hidden)) / per_layer))
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=12, num_key_value_heads=12, tie_word_embeddings=False)


def save_checkpoint(path, mb, shard_mb):
    """Saves the model and, under ``path``/warm, a small one of the same architecture (see measure)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = config_for(mb)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path, max_shard_size=f"{shard_mb}MB")
    cfg.update(dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=4))
    AutoModelForCausalLM.from_config(cfg).save_pretrained(os.path.join(path, "warm"))
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))


def _status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


class PeakSampler:
    """Highest RssAnon seen while running, sampled every ``interval`` seconds."""

    def __init__(self, interval=0.001):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _status()["RssAnon"])
            time.sleep(self.interval)

    def __enter__(self):
        self.peak = _status()["RssAnon"]
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _status()["RssAnon"])


def measure(path, case):
    """In a fresh process: load ``path`` as ``case`` says; returns the figures (bytes)."""
    import gc

    import torch

    import torchtpu  # noqa: F401
    from transformers import AutoModelForCausalLM

    kw = dict(CASES[case])
    if "dtype" in kw:
        kw["dtype"] = getattr(torch, kw["dtype"])
    # Untimed: start the device and load a small model of the same architecture the same way, so that the
    # baseline holds the plugin's memory and the modules from_pretrained imports on first use (~130 MB).
    torch.ones(1, device="tpu").cpu()
    AutoModelForCausalLM.from_pretrained(os.path.join(path, "warm"), **kw)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    base = _status()
    dev0 = torch.tpu.memory_allocated()
    t0 = time.perf_counter()
    with PeakSampler() as s:
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    load_s = time.perf_counter() - t0
    end = _status()
    assert all(p.device.type == kw["device_map"] for p in model.parameters())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in list(model.parameters()) + list(model.buffers())}
    model_bytes = sum(storages.values())
    # On CPU the parameters are views of the mmapped checkpoint (file pages, not RssAnon).
    resident = torch.tpu.memory_allocated() - dev0 if kw["device_map"] == "tpu" else 0
    return dict(load_s=load_s, model_bytes=model_bytes, resident=resident, peak_anon=s.peak - base["RssAnon"],
                peak_rss=end["VmHWM"] - base["VmRSS"], end_anon=end["RssAnon"] - base["RssAnon"])


def run_case(path, case):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, case], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{case}: child failed\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300, help="fp32 weights of the saved model, about (MB)")
    ap.add_argument("--shard-mb", type=int, default=100, help="save_pretrained(max_shard_size=...) in MB")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(*a.child)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        ckpt = save_checkpoint(tmp, a.mb, a.shard_mb)
        shards = sum(f.endswith(".safetensors") for f in os.listdir(tmp))
        res = {"checkpoint_mb": round(ckpt / MB, 1), "shards": shards, "cases": {}}
        for case in a.cases:
            r = run_case(tmp, case)
            overhead = r["peak_anon"] - r["resident"]
            res["cases"][case] = {
                "load_s": round(r["load_s"], 2),
                "resident_mb": round(r["resident"] / MB, 1),
                "model_mb": round(r["model_bytes"] / MB, 1),
                "peak_anon_mb": round(r["peak_anon"] / MB, 1),
                "peak_rss_mb": round(r["peak_rss"] / MB, 1),
                "end_anon_mb": round(r["end_anon"] / MB, 1),
                "overhead_mb": round(overhead / MB, 1),
                "overhead_x": round(overhead / ckpt, 3),
            }
    from _report import report  # benchmarks/_report.py

    report(res, a.json)


if __name__ == "__main__":
    main()
