"""Runs a corpus of StableHLO programs compiled with two sets of XLA options and
compares every result bit for bit.

    TORCHTPU_DUMP_DIR=/tmp/progs python some_workload.py      # collect programs
    python tools/compare_compile_options.py /tmp/progs --options xla_cpu_use_fusion_emitters=false

Each program runs on the same seeded inputs (floats ~ N(0, 2) with some
zeros, infinities, NaNs, large, small and subnormal values; integers in
[0, 4); booleans) in two fresh processes, one per
option set, with the disk cache off. Prints, per StableHLO op, in how many
programs holding it the results differed, and writes the details as JSON
(--json). A program whose results differ under the candidate options names
ops whose code generation changed bits.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DT = {"f32": "float32", "f64": "float64", "bf16": "bfloat16", "f16": "float16", "i1": "bool", "i8": "int8",
       "i16": "int16", "i32": "int32", "i64": "int64", "ui8": "uint8", "ui16": "uint16", "ui32": "uint32",
       "ui64": "uint64"}
_ARG = re.compile(r"%arg\d+: tensor<((?:\d+x)*)([a-z0-9]+)>")


def signature(text):
    head = text[text.index("@main("):]
    head = head[: head.index("{")]
    return [([int(d) for d in dims.split("x") if d], et) for dims, et in _ARG.findall(head)]


def ops_of(text):
    return sorted(set(re.findall(r"\b(stablehlo\.[a-z_]+|chlo\.[a-z_]+)", text)))


def child(files, out):
    sys.path.insert(0, ROOT)
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    import torch

    import torchtpu  # noqa: F401
    from torchtpu import _C

    torch.zeros(1, device="tpu").cpu()
    res = {}
    for f in files:
        text = open(f).read()
        name = os.path.basename(f)
        g = torch.Generator().manual_seed(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
        args = []
        try:
            for dims, et in signature(text):
                dt = getattr(torch, _DT[et])
                if dt.is_floating_point:
                    a = torch.randn(dims, generator=g, dtype=torch.float64) * 2
                    u = torch.rand(dims, generator=g, dtype=torch.float64)
                    a[u < 0.05] = 0
                    a[(u >= 0.05) & (u < 0.06)] *= float("inf")
                    a[(u >= 0.06) & (u < 0.07)] = float("nan")
                    a[(u >= 0.07) & (u < 0.12)] *= 1e4
                    a[(u >= 0.12) & (u < 0.17)] *= 1e-4
                    a[(u >= 0.17) & (u < 0.18)] *= 1e-39  # subnormal in f32
                    a = a.to(dt)
                elif dt == torch.bool:
                    a = torch.rand(dims, generator=g) < 0.5
                else:
                    a = torch.randint(0, 4, dims, generator=g).to(dt)
                args.append(a)
            outs = _C._run_program(text, args)
            res[name] = [hashlib.sha256(o).hexdigest()[:16] for o in outs]
        except Exception as e:  # noqa: BLE001 - recorded, compared as a result
            res[name] = "error: " + str(e)[:200]
    json.dump(res, open(out, "w"))


def run(files, options):
    with tempfile.NamedTemporaryFile(suffix=".json") as lst, tempfile.NamedTemporaryFile(suffix=".json") as out:
        json.dump(files, open(lst.name, "w"))
        env = dict(os.environ, TORCHTPU_CACHE_DIR="", TORCHTPU_XLA_OPTIONS=options, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", lst.name, out.name], env=env,
                       check=True)
        return json.load(open(out.name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--options", default="", help="candidate TORCHTPU_XLA_OPTIONS")
    ap.add_argument("--baseline", default="", help="baseline TORCHTPU_XLA_OPTIONS")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.load(open(a.child[0])), a.child[1])
        return
    files = sorted(glob.glob(os.path.join(a.dir, "*.mlir")))
    base, cand = run(files, a.baseline), run(files, a.options)
    per_op = {}
    differ = []
    for f in files:
        n = os.path.basename(f)
        same = base[n] == cand[n]
        if not same:
            differ.append(n)
        for op in ops_of(open(f).read()):
            s = per_op.setdefault(op, [0, 0])
            s[0] += 1
            s[1] += 0 if same else 1
    errors = sum(1 for v in base.values() if isinstance(v, str))
    print(f"{len(files)} programs, {len(differ)} differ, {errors} failed to run (baseline)")
    for op, (n, d) in sorted(per_op.items(), key=lambda kv: (-kv[1][1], kv[0])):
        print(f"  {op:40s} in {n:5d} programs, differ in {d}")
    if a.json:
        json.dump(dict(differ=differ, per_op=per_op, baseline=base, candidate=cand), open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
