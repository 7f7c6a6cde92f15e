#!/usr/bin/env python
"""Full OpInfo sweep: every op in PyTorch's op_db on "tpu" vs CPU.

    python tools/opinfo_sweep.py                         # all ops, float32, 3 samples each
    python tools/opinfo_sweep.py --ops add,mul --samples 5 --dtypes float32,bfloat16
    python tools/opinfo_sweep.py --ops 'nn.functional.*' --jobs 2
    python tools/opinfo_sweep.py --variants compiled --tag compiled   # through torch.compile(backend="tpu")

Ops run in worker subprocesses, a chunk of ops per worker; every sample's result is
streamed to a JSONL file as soon as it is known. When a worker dies (segfault, abort)
or an op exceeds --op-timeout, the op in progress is recorded as "crash"/"timeout" and
a new worker resumes the chunk after it, so one bad op never stops the sweep.

Writes reports/opinfo-<tag>.json and reports/opinfo-<tag>.md and prints a summary.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


# ------------------------------------------------------------------------------- worker


def worker(args):
    import torch

    import opinfo_util as U
    import torchtpu  # noqa: F401

    ops = U.ops_by_key()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    variants = tuple(args.variants.split(","))
    with open(args.worker_out, "a", buffering=1) as f:
        for key in args.worker_ops.split("\n"):
            if not key:
                continue
            op = ops[key]
            f.write(json.dumps({"start": key, "t": time.time()}) + "\n")
            if key == os.environ.get("OPINFO_SWEEP_TEST_CRASH"):  # exercises crash isolation
                os.abort()
            for dt in dtypes:
                if not U.supports_dtype(op, dt):
                    f.write(json.dumps({"op": key, "dtype": str(dt).replace("torch.", ""), "sample": -1,
                                        "desc": "", "records": [{"variant": "dtype", "status": "skip",
                                                                 "native": None, "fallbacks": [],
                                                                 "msg": "dtype not supported on cpu"}]}) + "\n")
                    continue
                U.run_op(op, dt, args.samples, variants,
                         on_sample=lambda r: f.write(json.dumps(r) + "\n"))
            f.write(json.dumps({"done": key}) + "\n")
    return 0


# ------------------------------------------------------------------------------- parent


def _read_jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a crash
    return out


def run_chunk(chunk, args, idx):
    """Runs a list of op keys in worker subprocesses; returns per-sample records."""
    fd, path = tempfile.mkstemp(prefix=f"opinfo-chunk{idx}-", suffix=".jsonl")
    os.close(fd)
    remaining = list(chunk)
    results = []
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env.setdefault("TORCHTPU_CACHE_DIR", os.path.join(tempfile.gettempdir(), "torchtpu-opinfo-cache"))
    while remaining:
        open(path, "w").close()
        cmd = [sys.executable, os.path.abspath(__file__), "--worker-out", path, "--dtypes", args.dtypes,
               "--samples", str(args.samples), "--variants", args.variants,
               "--worker-ops", "\n".join(remaining)]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT)
        killed = None
        last_start, last_key = time.time(), None
        while p.poll() is None:
            time.sleep(0.5)
            lines = _read_jsonl(path)
            starts = [ln for ln in lines if "start" in ln]
            if starts and starts[-1]["start"] != last_key:
                last_key, last_start = starts[-1]["start"], time.time()
            if time.time() - last_start > args.op_timeout:
                p.kill()
                killed = "timeout"
        try:
            _, err = p.communicate(timeout=30)
        except Exception:  # noqa: BLE001
            err = ""
        lines = _read_jsonl(path)
        done = {ln["done"] for ln in lines if "done" in ln}
        started = [ln["start"] for ln in lines if "start" in ln]
        results.extend(ln for ln in lines if "op" in ln)
        crashed = [k for k in started if k not in done]
        if p.returncode == 0 and not crashed:
            remaining = [k for k in remaining if k not in done]
            if remaining:  # worker exited early without a trace
                crashed = [remaining[0]]
            else:
                break
        if not crashed:
            # died before starting anything (import failure): record the first op, move on
            crashed = [remaining[0]]
        bad = crashed[-1]
        status = killed or "crash"
        tail = (err or "").strip().splitlines()[-3:]
        results.append({"op": bad, "dtype": args.dtypes, "sample": -1, "desc": "",
                        "records": [{"variant": "process", "status": status, "native": None, "fallbacks": [],
                                     "msg": f"worker rc={p.returncode}: " + " | ".join(tail)[:400]}]})
        print(f"  [{status}] {bad} (rc={p.returncode})", flush=True)
        remaining = [k for k in remaining if k not in done and k != bad]
    os.unlink(path)
    return results


def summarize(results):
    per_op = collections.OrderedDict()
    tot = collections.Counter()
    var_tot = collections.defaultdict(collections.Counter)
    for r in results:
        o = per_op.setdefault(r["op"], collections.Counter())
        recs = [x for x in r["records"] if x["status"] != "skip"]
        if r["sample"] < 0 and not recs:
            continue
        o["samples"] += 1
        tot["samples"] += 1
        sts = {x["status"] for x in recs}
        if not recs:
            o["skipped"] += 1
            tot["skipped"] += 1
            continue
        if sts == {"pass"}:
            o["pass"] += 1
            tot["pass"] += 1
        elif sts & {"crash", "timeout"}:
            o["crash"] += 1
            tot["crash"] += 1
        elif "error" in sts:
            o["error"] += 1
            tot["error"] += 1
        else:
            o["fail"] += 1
            tot["fail"] += 1
        if all(x["native"] for x in recs):
            o["native"] += 1
            tot["native"] += 1
        for x in recs:
            vt = var_tot[x["variant"]]
            vt["total"] += 1
            vt[x["status"]] += 1
            if x["native"]:
                vt["native"] += 1
            if x["status"] != "pass":
                o["bad_" + x["variant"]] += 1
            for fb in x.get("fallbacks", []):
                o["fb:" + fb] += 1
    return per_op, tot, var_tot


def pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def worst_ops(per_op, n=30):
    rows = [(k, c) for k, c in per_op.items() if c["fail"] + c["error"] + c["crash"] > 0]
    rows.sort(key=lambda kc: (-(kc[1]["fail"] + kc[1]["error"] + kc[1]["crash"]),
                              -sum(v for kk, v in kc[1].items() if kk.startswith("bad_")), kc[0]))
    return rows[:n]


def first_msgs(results, op, n=2):
    msgs = []
    for r in results:
        if r["op"] != op:
            continue
        for x in r["records"]:
            if x["status"] not in ("pass", "skip") and x["msg"]:
                m = f"{x['variant']}: {x['msg']}"
                if m not in msgs:
                    msgs.append(m)
    return msgs[:n]


def markdown(results, per_op, tot, var_tot, args, elapsed):
    ran = tot["samples"] - tot["skipped"]
    L = ["# OpInfo sweep report", "",
         f"Generated by `tools/opinfo_sweep.py` (dtypes `{args.dtypes}`, first {args.samples} samples per "
         f"OpInfo entry, variants `{args.variants}`) in {elapsed / 60:.1f} min. "
         "Each sample runs on tpu and on CPU; a sample passes when every applicable variant "
         "(functional, in-place, `out=`, backward, compiled) matches CPU or raises the same exception type "
         "as CPU. A sample is native when none of its variants used the CPU fallback (for `compiled`: and "
         "every graph was lowered, no eager graph fallback or graph break; listed as `graph:<reason>`).", "",
         "## Totals", "",
         "| OpInfo entries | samples run | pass | fail | error | crash/timeout | native |",
         "|---|---|---|---|---|---|---|",
         f"| {len(per_op)} | {ran} | {tot['pass']} ({pct(tot['pass'], ran)}) | {tot['fail']} | {tot['error']} | "
         f"{tot['crash']} | {tot['native']} ({pct(tot['native'], ran)}) |", "",
         "Per variant (each applicable variant of each sample):", "",
         "| variant | run | pass | fail | error | native |", "|---|---|---|---|---|---|"]
    for v, c in sorted(var_tot.items()):
        L.append(f"| {v} | {c['total']} | {c['pass']} ({pct(c['pass'], c['total'])}) | {c['fail']} | "
                 f"{c['error']} | {c['native']} ({pct(c['native'], c['total'])}) |")
    fully = sum(1 for c in per_op.values() if c["samples"] and c["pass"] == c["samples"] - c["skipped"])
    native_ops = sum(1 for c in per_op.values() if c["samples"] and c["native"] == c["samples"] - c["skipped"])
    L += ["", f"OpInfo entries with every sample passing: {fully}/{len(per_op)}; "
          f"with every sample native: {native_ops}/{len(per_op)}.", ""]
    fbs = collections.Counter()
    for c in per_op.values():
        for k, v in c.items():
            if k.startswith("fb:"):
                fbs[k[3:]] += v
    L += ["## Most frequent CPU / graph fallbacks (ATen op or `graph:` reason: variant runs)", "",
          ", ".join(f"`{k}` {v}" for k, v in fbs.most_common(40)), ""]
    L += ["## Worst ops (by failing samples)", "", "| op | samples | fail | error | crash | native | first failures |",
          "|---|---|---|---|---|---|---|"]
    for k, c in worst_ops(per_op, 30):
        msg = "<br>".join(m.replace("|", "\\|")[:160] for m in first_msgs(results, k))
        L.append(f"| `{k}` | {c['samples']} | {c['fail']} | {c['error']} | {c['crash']} | {c['native']} | {msg} |")
    L += ["", "## Least native ops (samples through the CPU fallback)", "",
          "| op | samples | native | fallback ATen ops |", "|---|---|---|---|"]
    rows = [(k, c) for k, c in per_op.items() if c["samples"] - c["skipped"] - c["native"] > 0]
    rows.sort(key=lambda kc: (-(kc[1]["samples"] - kc[1]["skipped"] - kc[1]["native"]), kc[0]))
    for k, c in rows[:40]:
        fb = ", ".join(f"`{kk[3:].replace('aten::', '')}`" for kk in sorted(c) if kk.startswith("fb:"))
        L.append(f"| `{k}` | {c['samples']} | {c['native']} | {fb[:200]} |")
    L += ["", "## All ops", "", "| op | samples | pass | fail | error | crash | native | bad variants |",
          "|---|---|---|---|---|---|---|---|"]
    for k, c in sorted(per_op.items()):
        bad = ", ".join(f"{kk[4:]}:{v}" for kk, v in sorted(c.items()) if kk.startswith("bad_"))
        L.append(f"| `{k}` | {c['samples']} | {c['pass']} | {c['fail']} | {c['error']} | {c['crash']} | "
                 f"{c['native']} | {bad} |")
    return "\n".join(L) + "\n"


def select_ops(patterns):
    import opinfo_util as U

    keys = [U.op_key(op) for op in U.all_ops()]
    if not patterns:
        return keys
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    return [k for k in keys if any(k == p or fnmatch.fnmatchcase(k, p) or fnmatch.fnmatchcase(k, p + ".*")
                                   for p in pats)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32", help="comma-separated torch dtype names")
    ap.add_argument("--samples", type=int, default=3, help="first N samples per OpInfo entry and dtype")
    ap.add_argument("--ops", default="", help="comma-separated op keys or fnmatch patterns")
    ap.add_argument("--variants", default="fn,inplace,out,grad",
                    help="comma-separated: fn, inplace, out, grad, compiled (torch.compile backend=tpu; "
                         "a graph that runs eagerly counts as not native)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes in parallel")
    ap.add_argument("--chunk", type=int, default=40, help="ops per worker process")
    ap.add_argument("--op-timeout", type=float, default=300.0, help="seconds before an op counts as hung")
    ap.add_argument("--tag", default="", help="report name suffix (default: dtypes)")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "reports"))
    ap.add_argument("--from-json", help="re-render the Markdown report of an earlier sweep's JSON")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--worker-ops", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        return worker(args)

    if args.from_json:
        with open(args.from_json) as f:
            d = json.load(f)
        for k, v in d["args"].items():
            if k not in ("from_json", "outdir"):
                setattr(args, k, v)
        per_op, tot, var_tot = summarize(d["samples"])
        mpath = os.path.splitext(args.from_json)[0] + ".md"
        with open(mpath, "w") as f:
            f.write(markdown(d["samples"], per_op, tot, var_tot, args, d["elapsed_s"]))
        print(mpath)
        return 0

    import opinfo_util as U

    unknown = [v for v in args.variants.split(",") if v not in U.ALL_VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {','.join(U.ALL_VARIANTS)}")
    t0 = time.time()
    keys = select_ops(args.ops)
    print(f"opinfo sweep: {len(keys)} OpInfo entries, dtypes {args.dtypes}, {args.samples} samples, "
          f"{args.jobs} job(s)", flush=True)
    chunks = [keys[i:i + args.chunk] for i in range(0, len(keys), args.chunk)]
    results = []
    with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {ex.submit(run_chunk, ch, args, i): i for i, ch in enumerate(chunks)}
        for n, fut in enumerate(cf.as_completed(futs), 1):
            results.extend(fut.result())
            print(f"  chunk {n}/{len(chunks)} done ({time.time() - t0:.0f}s)", flush=True)
    order = {k: i for i, k in enumerate(keys)}
    results.sort(key=lambda r: (order.get(r["op"], 1 << 30), r["dtype"], r["sample"]))
    elapsed = time.time() - t0
    per_op, tot, var_tot = summarize(results)
    os.makedirs(args.outdir, exist_ok=True)
    tag = args.tag or args.dtypes.replace(",", "-")
    jpath = os.path.join(args.outdir, f"opinfo-{tag}.json")
    mpath = os.path.join(args.outdir, f"opinfo-{tag}.md")
    with open(jpath, "w") as f:
        json.dump({"args": vars(args), "elapsed_s": elapsed, "totals": dict(tot),
                   "variants": {k: dict(v) for k, v in var_tot.items()},
                   "ops": {k: dict(v) for k, v in per_op.items()}, "samples": results}, f, indent=1)
    with open(mpath, "w") as f:
        f.write(markdown(results, per_op, tot, var_tot, args, elapsed))

    ran = tot["samples"] - tot["skipped"]
    print()
    print(f"{'OpInfo entries':24s}{len(per_op)}")
    print(f"{'samples run':24s}{ran}")
    print(f"{'pass':24s}{tot['pass']:6d}  {pct(tot['pass'], ran)}")
    print(f"{'fail':24s}{tot['fail']:6d}")
    print(f"{'error':24s}{tot['error']:6d}")
    print(f"{'crash/timeout':24s}{tot['crash']:6d}")
    print(f"{'native':24s}{tot['native']:6d}  {pct(tot['native'], ran)}")
    print()
    print(f"{'variant':10s}{'run':>7s}{'pass':>8s}{'fail':>7s}{'error':>7s}{'native':>8s}")
    for v, c in sorted(var_tot.items()):
        print(f"{v:10s}{c['total']:7d}{c['pass']:8d}{c['fail']:7d}{c['error']:7d}{c['native']:8d}")
    print()
    print(f"{'worst ops':40s}{'samples':>8s}{'fail':>6s}{'error':>6s}{'crash':>6s}{'native':>7s}")
    for k, c in worst_ops(per_op, 30):
        print(f"{k:40s}{c['samples']:8d}{c['fail']:6d}{c['error']:6d}{c['crash']:6d}{c['native']:7d}")
    print(f"\nreports: {mpath}\n         {jpath}  ({elapsed:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
