"""torch.distributed on "tpu" (Gloo staging) vs Gloo on CPU tensors, in one run.

    python benchmarks/bench_distributed.py [--nproc 2] [--max-mb 64] [--iters 10] [--ddp-steps 8]

Reports:
  * all_reduce (SUM, float32) from 1 KB to --max-mb on --nproc processes:
    time per call and bus bandwidth (2 (n-1)/n x bytes / time, NCCL's
    definition) for tpu tensors on the "tpu" backend and for CPU tensors on a
    Gloo group of the same processes (the same transport without the staging),
    with the tpu/gloo time ratio; the tpu backend is measured with and without
    the cross-rank size check (TORCHTPU_DIST_CHECK), which costs one small
    message per call. Sizes alternate between the backends.
  * DDP training step of the demo GPT (batch 8 per process) on 1 and on
    --nproc processes: step time and scaling efficiency (1-process step time /
    n-process step time, per-process batch fixed).
Times are the fastest of the repetitions (this machine is shared).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")


def _timeit(fn, iters):
    fn()  # warm-up (compiles, connections)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)  # the machine is shared: the fastest call is the least disturbed


def worker_allreduce(rank, world, store, max_mb, iters, out):
    import torch
    import torch.distributed as dist

    import torchtpu  # noqa: F401

    dist.init_process_group("tpu", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    nocheck = None
    rows = []
    nbytes = 1024
    while nbytes <= max_mb * (1 << 20):
        n = nbytes // 4
        x_t = torch.ones(n, device="tpu")
        x_c = torch.ones(n)
        it = max(3, min(iters, int(iters * (4 << 20) / nbytes))) if nbytes > (4 << 20) else iters * 5

        def tpu():
            dist.all_reduce(x_t)
            torch.tpu.synchronize()

        t_gloo = _timeit(lambda: dist.all_reduce(x_c, group=gloo), it)
        t_tpu = _timeit(tpu, it)
        if nocheck is None:
            os.environ["TORCHTPU_DIST_CHECK"] = "0"
            nocheck = dist.new_group(backend="tpu")
        t_nock = _timeit(lambda: (dist.all_reduce(x_t, group=nocheck), torch.tpu.synchronize()), it)
        bus = 2 * (world - 1) / world * nbytes
        rows.append({"bytes": nbytes, "gloo_s": t_gloo, "tpu_s": t_tpu, "tpu_nocheck_s": t_nock,
                     "gloo_busbw_GBs": bus / t_gloo / 1e9, "tpu_busbw_GBs": bus / t_tpu / 1e9,
                     "tpu_nocheck_busbw_GBs": bus / t_nock / 1e9})
        nbytes *= 4
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def worker_ddp(rank, world, store, steps, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchtpu  # noqa: F401
    from torchtpu.examples.gpt import GPTConfig, batches, make_model, synthetic_corpus

    if world > 1:
        dist.init_process_group("tpu", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
    cfg = GPTConfig()
    data = list(batches(synthetic_corpus(20000, cfg.vocab_size), 8, cfg.block_size, steps + 2, seed=rank + 1))
    model = make_model(cfg).to("tpu")
    if world > 1:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        loss = model(x.to("tpu"), y.to("tpu"))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_s": min(times[2:])}, f)
    if world > 1:
        dist.destroy_process_group()


def launch(args_for_rank, world, timeout=900):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", *args_for_rank(r)], env=env)
             for r in range(world)]
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {[p.returncode for p in procs]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--max-mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--ddp-steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2, help="DDP runs per process count (fastest kept)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        kind, rank, world, store, out, *rest = a.worker
        if kind == "allreduce":
            worker_allreduce(int(rank), int(world), store, int(rest[0]), int(rest[1]), out)
        else:
            worker_ddp(int(rank), int(world), store, int(rest[0]), out)
        return
    tmp = tempfile.mkdtemp(prefix="tt-bench-dist-")
    os.environ.setdefault("TORCHTPU_CACHE_DIR", os.path.join(tmp, "cache"))
    W = a.nproc
    res = {"nproc": W}
    out = os.path.join(tmp, "ar.json")
    launch(lambda r: ["allreduce", str(r), str(W), os.path.join(tmp, "s0"), out, str(a.max_mb), str(a.iters)], W)
    res["all_reduce"] = json.load(open(out))
    print(f"all_reduce float32 SUM on {W} processes: tpu backend (Gloo staging) vs Gloo on CPU tensors")
    print(f"{'size':>8} {'gloo ms':>9} {'tpu ms':>9} {'tpu/gloo':>9} {'nocheck ms':>11} {'nochk/gloo':>10} "
          f"{'gloo GB/s':>10} {'tpu GB/s':>9}")
    for r in res["all_reduce"]:
        b = r["bytes"]
        size = f"{b >> 20}MB" if b >= 1 << 20 else f"{b >> 10}KB"
        print(f"{size:>8} {r['gloo_s'] * 1e3:9.3f} {r['tpu_s'] * 1e3:9.3f} {r['tpu_s'] / r['gloo_s']:9.2f} "
              f"{r['tpu_nocheck_s'] * 1e3:11.3f} {r['tpu_nocheck_s'] / r['gloo_s']:10.2f} "
              f"{r['gloo_busbw_GBs']:10.3f} {r['tpu_busbw_GBs']:9.3f}")
    steps = {1: float("inf"), W: float("inf")}
    for k in range(a.repeat):  # 1 and W processes take turns
        for n in (1, W):
            out = os.path.join(tmp, f"ddp{n}.json")
            launch(lambda r: ["ddp", str(r), str(n), os.path.join(tmp, f"d{n}_{k}"), out, str(a.ddp_steps)], n)
            steps[n] = min(steps[n], json.load(open(out))["step_s"])
    res["ddp_step_s"] = steps
    print(f"DDP GPT step (batch 8 per process): 1 process {steps[1] * 1e3:.1f} ms, {W} processes "
          f"{steps[W] * 1e3:.1f} ms, scaling efficiency {steps[1] / steps[W]:.2f} "
          f"(throughput x{W * steps[1] / steps[W]:.2f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
