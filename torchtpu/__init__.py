"""torchtpu: a native PyTorch backend for XLA devices over PJRT.

Importing torchtpu (or just torch, through the torch.backends entry point)
registers the "tpu" device: tensors on it are plain torch.Tensors.
"""
from __future__ import annotations

import os
import threading

# Keep XLA's C++ logging quiet unless the user asked for it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import torch

__version__ = "0.1.0"

from . import _env, _plugin  # noqa: E402

_lock = threading.RLock()
_registered = False
_plugin_kind = None
_plugin_path = None
_plugin_error = None


def _configure() -> None:
    global _plugin_kind, _plugin_path, _plugin_error
    from . import _C

    _plugin_error = None

    try:
        _plugin_kind, _plugin_path = _plugin.resolve()
    except ImportError as e:  # reported on first use of the device
        _plugin_error = e
        _plugin_kind, _plugin_path = None, ""
    try:
        index = _physical_index(_env.VISIBLE_DEVICES.get(), os.environ.get("LOCAL_RANK"), _requested_index)
    except ValueError as e:  # reported on first use of the device, like a missing plugin
        _plugin_error, index = e, 0
    count = int(_env.CPU_DEVICES.get() or "1")
    if _plugin_kind == "cpu":
        count = max(count, index + 1)
    _C._configure(_plugin_path or "", _plugin_kind or "", count, index,
                  _env.parse_bytes(_env.MEMORY_LIMIT.get()), _env.cache_dir(), __version__,
                  str(_plugin_error) if _plugin_error is not None else "")


_requested_index = None


def _physical_index(visible: str, local_rank: str | None, requested: int | None) -> int:
    """The physical device this process drives.

    The local slot is ``torch.tpu.set_device(i)`` if called, else ``LOCAL_RANK``
    (set by torchrun), else 0. ``TORCHTPU_VISIBLE_DEVICES`` with one index pins
    the device; with a list ("4,5,6,7") the slot indexes into it, like
    CUDA_VISIBLE_DEVICES with ``cuda.set_device(local_rank)``.
    """
    slot = requested
    if slot is None:
        slot = int(local_rank) if local_rank not in (None, "") else 0
    devs = [int(x) for x in visible.split(",") if x.strip()]
    if not devs:
        return slot
    if len(devs) == 1:
        return devs[0]
    if not 0 <= slot < len(devs):
        raise ValueError(f"torchtpu: device slot {slot} (LOCAL_RANK or torch.tpu.set_device) is out of range "
                         f"for TORCHTPU_VISIBLE_DEVICES={visible!r} ({len(devs)} devices)")
    return devs[slot]


def _register() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        from . import _C, device_module

        _configure()
        torch.utils.rename_privateuse1_backend("tpu")
        torch._register_device_module("tpu", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                             for_packed_sequence=True, for_storage=True)
        from . import _quant_ops  # noqa: F401  torchtpu:: op schemas, bound natively next
        _C._register_kernels()
        # At exit, before the interpreter (and then the plugin's own statics) go:
        # compiles not started are cancelled, running ones finished, queued
        # launches settled, so no compile thread is inside XLA when it unloads.
        import atexit

        atexit.register(_C._shutdown)
        # XLA devices compute in bfloat16 natively: make it autocast's default.
        torch.set_autocast_dtype("tpu", torch.bfloat16)
        from . import _compile

        _compile.register()
        from . import distributed

        distributed.register()
        _registered = True
        mode = _env.MODE.get()
        if mode and mode != "strict":
            set_mode(mode)


_MODES = {"strict": 0, "debug": 1, "defer_and_fuse": 2}
_MODE_NAMES = {v: k for k, v in _MODES.items()}


def set_mode(mode: str, *, check_nans: bool | None = None) -> None:
    """Sets the eager mode: "strict" (default), "debug" or "defer_and_fuse".

    Switching flushes pending (deferred) work. In debug mode every op runs
    synchronously (device errors are raised by the op's own call), index
    arguments are bounds-checked with CPU PyTorch's errors, outputs are
    validated against PyTorch's meta functions, and with ``check_nans=True``
    (or ``TORCHTPU_DEBUG_NANS=1``) the first op producing a NaN/Inf in a float
    output raises.
    """
    from . import _C

    if mode not in _MODES:
        raise ValueError(f"torchtpu.set_mode: unknown mode {mode!r}; choose one of {list(_MODES)}")
    if check_nans is not None:
        _C._set_debug_nans(bool(check_nans))
    _C._set_mode(_MODES[mode])


def get_mode() -> str:
    from . import _C

    return _MODE_NAMES[_C._get_mode()]


class mode:
    """Thread-local eager mode: ``with torchtpu.mode("debug"): ...``."""

    def __init__(self, name: str):
        if name not in _MODES:
            raise ValueError(f"torchtpu.mode: unknown mode {name!r}; choose one of {list(_MODES)}")
        self.name = name

    def __enter__(self):
        from . import _C

        # Scoped through c10's thread-local debug info, so autograd's device
        # threads run backward in this mode too. Entering/leaving flushes.
        _C._push_thread_mode(_MODES[self.name])
        return self

    def __exit__(self, *exc):
        from . import _C

        _C._pop_thread_mode()
        return False


def _ensure_started() -> None:
    from . import _C

    if _C._started():
        return
    if _plugin_error is not None:
        raise _plugin_error
    try:
        _C._start()
    except RuntimeError as e:
        msg = str(e)
        if _plugin_kind == "tpu":
            msg += " (TORCHTPU_PLUGIN=tpu needs a Cloud TPU host; on other machines use cpu or cuda)"
        raise RuntimeError(msg) from None


def metrics() -> dict:
    """Counters: native ops, CPU fallbacks, compiles, cache hits, transfers, buffers."""
    from . import _C

    m = _C._metrics()
    m["native_ops"] = dict(m["native_ops"])
    m["cpu_fallbacks"] = dict(m["cpu_fallbacks"])
    m["native_executions"] = sum(m["native_ops"].values())
    from . import _compile

    m["compile"] = _compile.metrics()
    m["mode"] = get_mode()
    return m


def set_defer_chunk_ops(n: int) -> int:
    """defer_and_fuse: a loop that reads the host every iteration (``loss.item()``)
    is cut into parts of about ``n`` ops, so the device runs one part while
    the host records the next; 0 keeps each iteration one region. Returns the
    previous value (default ``TORCHTPU_DEFER_CHUNK_OPS``, else 48)."""
    from . import _C

    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_defer_chunk_ops: n must be an int, got {type(n).__name__}")
    if n < 0:
        raise ValueError(f"set_defer_chunk_ops: n must be >= 0, got {n}")
    return _C._set_defer_chunk_ops(n)


def reset_metrics() -> None:
    from . import _C

    _C._reset_metrics()


def metrics_report() -> str:
    """Prints (and returns) the metrics in a readable form."""
    m = metrics()
    lines = ["torchtpu metrics", "-" * 40]
    for k in ("mode", "compiles", "compile_seconds", "cache_hits", "cache_misses", "disk_cache_hits",
              "executions", "executable_cache_entries", "bytes_host_to_device", "bytes_device_to_host",
              "live_buffers", "live_buffer_bytes", "native_executions"):
        v = m[k]
        lines.append(f"{k:28s} {v:.3f}" if isinstance(v, float) else f"{k:28s} {v}")
    lines.append("native ops:")
    for k, v in sorted(m["native_ops"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:40s} {v}")
    lines.append("cpu fallbacks:" + (" none" if not m["cpu_fallbacks"] else ""))
    for k, v in sorted(m["cpu_fallbacks"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:40s} {v}")
    text = "\n".join(lines)
    print(text)
    return text


def lowered_ops() -> list[str]:
    from . import _C

    return list(_C._lowered_ops())


_register()
