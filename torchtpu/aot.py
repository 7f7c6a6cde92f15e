"""Compiling for a Cloud TPU without one (libtpu's compile-only mode).

libtpu compiles for a TPU *topology* ("v5e:1x1", "v5e:2x2", "v6e:2x2",
"v5p:2x2x1", "tpu7x:2x2x1", ...) with no TPU present, through the same PJRT C
API torchtpu runs on. Nothing executes on a TPU; programs still run on this
process's plugin (the XLA CPU plugin by default).

* :func:`check` (or ``TORCHTPU_TPU_CHECK=v5e:1x1``): every program this
  process compiles is also compiled for the topology, on a background thread;
  :func:`check_report` lists the failures and the largest memory figures.
  ``strict=True`` (``TORCHTPU_TPU_CHECK_STRICT=1``) compiles at once and
  raises at the op whose program does not compile for the TPU.
* :func:`memory`: runs a function (an eager step, a ``torch.compile``d one,
  a training step) once, compiles each program it ran for the topology and
  answers "does this fit on the chip?" with per-program figures.
* :func:`compile_text`: one StableHLO module, for a topology, with
  ``num_replicas`` chips (collectives across them).
* :func:`lower` / :func:`graph_text`: a function's (or an ATen FX graph's)
  program for a TPU from shapes alone (meta tensors: nothing is allocated or
  run), so a step too large for this machine (one rank of a pod recipe:
  ``torchtpu.titan.fit``) still gets the TPU compiler's memory figures.

libtpu is an optional extra (``pip install 'torchtpu[tpu]'``); it is loaded
from the installed ``libtpu`` package or ``TPU_LIBRARY_PATH``, never bundled.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import torch

__all__ = ["HBM_BYTES", "MemoryReport", "check", "check_report", "compile_text", "describe", "graph_text",
           "hbm_bytes", "libtpu_path", "lower", "memory"]

_TOPOLOGY = re.compile(r"^([a-zA-Z0-9_ ]+)[=_:]([0-9x]+)(_twisted|_untwisted)?$")

# HBM per chip, from Google Cloud's TPU documentation.
HBM_BYTES = {
    "v4": 32 << 30,
    "v5e": 16 << 30, "v5litepod": 16 << 30,
    "v5p": 95 << 30,
    "v6e": 32 << 30,
    "tpu7x": 192 << 30,
}


def libtpu_path() -> str:
    """The libtpu shared library: ``TPU_LIBRARY_PATH``, else the installed ``libtpu`` package."""
    path = os.environ.get("TPU_LIBRARY_PATH", "")
    if not path:
        from ._plugin import _package_dir

        d = _package_dir("libtpu")
        path = os.path.join(d, "libtpu.so") if d else ""
    if not path or not os.path.exists(path):
        raise RuntimeError("torchtpu.aot needs libtpu to compile for a TPU topology: pip install 'torchtpu[tpu]' "
                           "(libtpu==0.0.51), or set TPU_LIBRARY_PATH to a libtpu.so")
    return path


def _topology(topology: str) -> str:
    if not isinstance(topology, str) or not _TOPOLOGY.match(topology):
        raise ValueError(f"torchtpu.aot: topology must look like 'v5e:1x1', 'v5e:2x2', 'v5p:2x2x1', got {topology!r}")
    return topology


def hbm_bytes(topology: str) -> int | None:
    """HBM of one chip of the topology's generation (None if unknown)."""
    return HBM_BYTES.get(_TOPOLOGY.match(_topology(topology)).group(1).lower())


def describe(topology: str) -> dict:
    """The topology as libtpu sees it: chips, platform version, the plugin's StableHLO versions."""
    from . import _C

    return dict(_C._tpu_describe(libtpu_path(), _topology(topology)))


def compile_text(text: str, topology: str = "v5e:1x1", num_replicas: int = 1) -> dict:
    """Compiles one StableHLO module for the topology. Returns ``ok``, ``error`` and
    the program's memory (code, argument, output, alias, temp, peak bytes per chip)."""
    from . import _C

    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"torchtpu.aot.compile_text: num_replicas must be a positive int, got {num_replicas!r}")
    return dict(_C._tpu_compile(libtpu_path(), _topology(topology), text, num_replicas))


def check(topology: str | None, strict: bool = False) -> None:
    """Compile every program this process compiles from now on for ``topology`` too
    (None or "" stops). ``strict``: at once, raising at the op whose program fails."""
    from . import _C
    from ._device import ensure_started

    ensure_started()
    if not topology:
        _C._tpu_check_configure("", "", False)
        return
    _C._tpu_check_configure(libtpu_path(), _topology(topology), bool(strict))


def check_report(wait: bool = True, reset: bool = False) -> dict:
    """What the TPU check found: programs compiled, failures (the plugin's error, the
    program's StableHLO ops and text), the largest temp/argument/output/peak bytes, and
    the five programs slowest to compile for the TPU (``slowest``: seconds, ops).
    ``wait``: after the queued programs are compiled."""
    from . import _C

    r = dict(_C._tpu_check_report(bool(wait)))
    if reset:
        _C._tpu_check_reset()
    return r


@dataclass
class MemoryReport:
    topology: str
    hbm_bytes: int | None          # one chip's HBM (None: unknown generation)
    programs: list = field(default_factory=list)  # per distinct program: bytes and times run
    live_peak_bytes: int = 0       # most device memory held between programs (this process's plugin)
    max_temp_bytes: int = 0        # largest scratch any one program needs on the TPU
    failures: list = field(default_factory=list)

    @property
    def estimated_peak_bytes(self) -> int:
        """Live tensors at their peak plus the largest program's scratch: what the
        step needs of one chip (an estimate: TPU layouts pad small dims, which the
        per-program argument/output figures include and the live figure does not)."""
        return self.live_peak_bytes + self.max_temp_bytes

    @property
    def fits(self) -> bool | None:
        if self.failures:
            return False
        return None if self.hbm_bytes is None else self.estimated_peak_bytes <= self.hbm_bytes

    def __str__(self) -> str:
        gib = lambda b: f"{b / (1 << 30):.3f} GiB"  # noqa: E731
        lines = [f"torchtpu.aot.memory on {self.topology}: {len(self.programs)} programs, "
                 f"{len(self.failures)} failed to compile",
                 f"  live tensors at peak  {gib(self.live_peak_bytes)}",
                 f"  largest scratch       {gib(self.max_temp_bytes)}",
                 f"  estimated peak        {gib(self.estimated_peak_bytes)}"
                 + (f" of {gib(self.hbm_bytes)} HBM: {'fits' if self.fits else 'does NOT fit'}"
                    if self.hbm_bytes else "")]
        for f in self.failures[:5]:
            lines.append("  failed: " + f["error"].splitlines()[0][:200])
        return "\n".join(lines)


def memory(fn, *args, topology: str = "v5e:1x1", **kwargs):
    """Runs ``fn(*args, **kwargs)`` once on this process's device, compiles every
    program it ran for ``topology``, and returns ``(result, MemoryReport)``.

    Eager ops compile on first sight for the capture (no host tier), op plans
    and compiled-graph plans are bypassed so each program's text is seen;
    ``fn`` runs as it would otherwise (same results)."""
    from . import _C
    from ._device import ensure_started

    ensure_started()
    path, topology = libtpu_path(), _topology(topology)
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    _C._push_warmup()
    _C._capture_programs_start()
    try:
        result = fn(*args, **kwargs)
        torch.tpu.synchronize()
    finally:
        texts = _C._capture_programs_stop()
        _C._pop_warmup()
    report = MemoryReport(topology=topology, hbm_bytes=hbm_bytes(topology))
    report.live_peak_bytes = torch.tpu.max_memory_allocated()
    counts: dict[str, int] = {}
    for t in texts:
        counts[t] = counts.get(t, 0) + 1
    for text, n in counts.items():
        r = dict(_C._tpu_compile(path, topology, text, 1))
        r["runs"] = n
        if not r["ok"]:
            ops = sorted(set(re.findall(r'"stablehlo\.([a-z_]+)"', text)))
            report.failures.append({"error": r["error"], "ops": ops, "program": text})
            continue
        report.programs.append(r)
        report.max_temp_bytes = max(report.max_temp_bytes, r["temp_bytes"])
    return result, report


def graph_text(gm: torch.fx.GraphModule) -> str:
    """The StableHLO program of an ATen FX graph (torch.compile's lowering: the same
    registry as eager ops), for a TPU, from its nodes' ``meta["val"]`` alone: never
    run, so its inputs may be meta or fake tensors of any size. Each tensor input,
    number and random key is a program argument; the results are the graph's outputs
    (less those that are inputs) and then the inputs it writes. Raises
    ``torchtpu.compile.lower.Unsupported`` naming what does not lower."""
    from . import _C
    from .compile.lower import Unsupported, _et, _Lowerer

    program = _Lowerer(gm).run()
    if program["constants"] or program["cpu_updates"] or program["pad_inputs"]:
        raise Unsupported("torchtpu.aot.graph_text: graphs with constants, CPU inputs written in place or "
                          "padded offsets are not supported")
    specs = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            specs.append((_et(v.dtype), list(v.shape)))
        elif isinstance(v, bool):
            specs.append((_et(torch.bool),))
        elif isinstance(v, int):
            specs.append((_et(torch.int64),))
        elif isinstance(v, float):
            specs.append((_et(torch.float32),))
        else:
            specs.append(None)
    graph = _C._build_graph("aot", *program["build"])
    return _C._graph_text(graph, specs, True)


def lower(fn, *args, **kwargs) -> str:
    """``fn(*args, **kwargs)`` traced into one functional ATen graph (torch.compile's
    decompositions) and lowered for a TPU by :func:`graph_text`. The tensors in args
    may be meta tensors or fake "tpu" tensors (made under a ``FakeTensorMode``: code that
    asks the device type, such as autocast, sees "tpu"); nothing is allocated or run. A
    function that calls ``torch.autograd.grad`` gives one program with its forward and
    backward."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from .compile.lower import _decomposition_table

    # traced as called (autograd.grad sees inputs that require grad), then functionalized
    def tupled(*a):
        out = fn(*a, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    gm = make_fx(tupled, decomposition_table=_decomposition_table(), tracing_mode="fake")(*args)
    plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    gm = make_fx(torch.func.functionalize(gm, remove="mutations_and_views"),
                 decomposition_table=_decomposition_table(), tracing_mode="fake")(*plain)
    return graph_text(gm)
