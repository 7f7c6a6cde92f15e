"""Shared by the benchmarks: print the results and save them as JSON; the
thread settings a run used; spread of timed samples; settling the device
before a timed section (so no earlier launch or compile lands inside it)."""
from __future__ import annotations

import json
import os
import statistics


def report(res: dict, path: str | None) -> None:
    print(json.dumps(res, indent=2))
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=2)


def spread(samples) -> dict:
    """Median and spread of timed samples (seconds in, milliseconds out)."""
    s = sorted(samples)
    if not s:
        return {"n": 0}
    q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
    return {"n": len(s), "median_ms": round(statistics.median(s) * 1e3, 3), "min_ms": round(s[0] * 1e3, 3),
            "p25_ms": round(q[0] * 1e3, 3), "p75_ms": round(q[2] * 1e3, 3), "max_ms": round(s[-1] * 1e3, 3),
            "iqr_over_median": round((q[2] - q[0]) / statistics.median(s), 3) if statistics.median(s) else None}


def thread_settings() -> dict:
    """What shares the cores in this run: torch's intra/inter-op pools, torchtpu's
    compile threads, and the XLA CPU client's pool (sized by the CPUs this process
    may run on: os.sched_getaffinity, set with taskset), and the load when it began."""
    import torch

    import torchtpu

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": os.cpu_count(), "schedulable_cpus (XLA CPU client pool)": cpus,
            "torch_intra_op_threads": torch.get_num_threads(), "torch_inter_op_threads": torch.get_num_interop_threads(),
            "torchtpu_compile_threads": torchtpu.metrics()["compile_threads"],
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "TORCHTPU_XLA_OPTIONS": os.environ.get("TORCHTPU_XLA_OPTIONS"),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def settle() -> None:
    """Waits until every launched program ran (and every pending compile ended), so
    the next timed section measures only its own work."""
    import torch

    from torchtpu import _C

    torch.tpu.synchronize()
    assert _C._launches_queued() == 0
