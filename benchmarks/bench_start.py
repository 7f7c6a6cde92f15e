"""Start-up: time to the first printed result in a fresh process, beyond `import torch`.

    python benchmarks/bench_start.py [--runs 5] [--json out.json]

Each run is a fresh interpreter executing
    import torch, torchtpu; x = torch.randn(3, 3, device="tpu"); print(x + 1)
against one executing only `import torch` (the reference, same machine, same
moment), with a warm persistent compilation cache (a first run fills it).
Also reports whether the first ops imported torch._dynamo or sympy (PyTorch's
Python meta kernels do; torchtpu's C++ output-metadata rules avoid them).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from _report import report  # benchmarks/_report.py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIRST_OP = r"""
import time, sys, json
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torchtpu

x = torch.randn(3, 3, device="tpu")
print(x + 1)
t2 = time.perf_counter()
m = torchtpu.metrics()
print(json.dumps({"import_torch_s": t1 - t0, "beyond_import_torch_s": t2 - t1,
                  "dynamo_imported": "torch._dynamo" in sys.modules, "sympy_imported": "sympy" in sys.modules,
                  "compiles": m["compiles"], "disk_cache_hits": m["disk_cache_hits"],
                  "python_meta_ops": m["python_meta_ops"]}))
"""


def _run(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    with tempfile.TemporaryDirectory(prefix="torchtpu-start-") as cache:
        env["TORCHTPU_CACHE_DIR"] = cache
        cold = _run(FIRST_OP, env)  # fills the persistent cache
        warm = [_run(FIRST_OP, env) for _ in range(args.runs)]
    res = {
        "cold_cache": cold,
        "warm_beyond_import_torch_s": statistics.median(w["beyond_import_torch_s"] for w in warm),
        "warm_import_torch_s": statistics.median(w["import_torch_s"] for w in warm),
        "warm_compiles": max(w["compiles"] for w in warm),
        "dynamo_imported": any(w["dynamo_imported"] for w in warm),
        "sympy_imported": any(w["sympy_imported"] for w in warm),
        "python_meta_ops": warm[-1]["python_meta_ops"],
    }
    report(res, args.json)


if __name__ == "__main__":
    main()
