"""Printing tpu tensors vs CPU tensors, each in a fresh process with an empty
program cache (the case a user meets: printing a new tensor in a notebook).

    python benchmarks/bench_print.py [--repeat 3] [--json out.json]

For each size, a fresh process times repr() of a CPU tensor (its third print,
so CPU's own first-call costs are paid) and of the same tensor on tpu (after
one unrelated tpu op, so client start-up is not counted), with
TORCHTPU_HOST_TIER as given (default: the product default), then prints again
(second print of the same shapes) and a third time. "path-warm" rows first
print one 3x3 tpu tensor (other shapes: the 64x64 print's programs are still
new), so the process's one-time costs of the printing path are paid as CPU's
are; the other rows hold them.
Reported: ms per repr and the tpu/CPU ratio, compiles per print.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time, torch, torchtpu
shape = tuple(int(s) for s in sys.argv[1].split("x"))
torch.manual_seed(0)
x = torch.randn(shape)
repr(torch.randn(2, 2)); repr(x)  # CPU printing warm (imports, formatter)
t0 = time.perf_counter(); repr(x); cpu = time.perf_counter() - t0
(torch.ones(3, device="tpu") + 1).cpu()  # client started, first-op imports done
xt = x.to("tpu"); torch.tpu.synchronize()
out = {"cpu_ms": cpu * 1e3}
if sys.argv[2] == "1":  # the process's printing path warmed by one print of other shapes
    repr(torch.randn(3, 3, device="tpu")); torch.tpu.synchronize()
for k in ("first", "second", "third"):
    torchtpu.reset_metrics()
    t0 = time.perf_counter(); s = repr(xt); dt = time.perf_counter() - t0
    m = torchtpu.metrics()
    out[k + "_ms"] = dt * 1e3
    out[k + "_compiles"] = m["compiles"]
    out[k + "_host_tier_ops"] = sum(m["host_tier_ops"].values())
print(json.dumps(out))
"""


def run(shape: str, host_tier: str | None, warm_path: bool = False) -> dict:
    env = dict(os.environ, TORCHTPU_CACHE_DIR="", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if host_tier is not None:
        env["TORCHTPU_HOST_TIER"] = host_tier
    r = subprocess.run([sys.executable, "-c", CHILD, shape, "1" if warm_path else "0"], env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shapes", default="64x64,8x8,512x512")
    ap.add_argument("--json")
    args = ap.parse_args()
    report = {}
    for shape in args.shapes.split(","):
        for tier, warm_path in ((None, False), (None, True), ("0", False)):
            name = f"{shape} host_tier={'default' if tier is None else tier}" + (" path-warm" if warm_path else "")
            runs = [run(shape, tier, warm_path) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            med["first_ratio"] = med["first_ms"] / med["cpu_ms"]
            med["third_ratio"] = med["third_ms"] / med["cpu_ms"]
            report[name] = med
            print(f"{name:32s} cpu {med['cpu_ms']:7.2f} ms | tpu first {med['first_ms']:8.1f} ms "
                  f"({med['first_ratio']:6.1f}x, {med['first_compiles']:.0f} compiles) | second "
                  f"{med['second_ms']:8.1f} ms ({med['second_compiles']:.0f}) | third {med['third_ms']:8.1f} ms "
                  f"({med['third_compiles']:.0f}; {med['third_ratio']:.1f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
