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

from . import _device, _env  # noqa: E402
from ._version import __version__  # noqa: E402,F401
from ._modes import get_mode, mode, set_mode, warmup  # noqa: E402,F401

_lock = threading.RLock()
_registered = False
# start-up state (plugin, device index) lives in torchtpu._device
_physical_index = _device.physical_index
_ensure_started = _device.ensure_started
_configure = _device.configure


def __getattr__(name: str):
    if name in ("_plugin_kind", "_plugin_path", "_plugin_error"):
        return getattr(_device, name[1:])
    raise AttributeError(f"module 'torchtpu' has no attribute {name!r}")


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
        from .quant import ops as _quant_ops  # noqa: F401  torchtpu:: op schemas, bound natively next
        from . import paged as _paged  # noqa: F401  torchtpu::paged_attention
        _C._register_kernels()
        # At exit, before the interpreter (and then the plugin's own statics) go:
        # compiles not started are cancelled, running ones finished, queued
        # launches settled, so no compile thread is inside XLA when it unloads.
        import atexit

        atexit.register(_C._shutdown)
        # XLA devices compute in bfloat16 natively: make it autocast's default.
        torch.set_autocast_dtype("tpu", torch.bfloat16)
        from . import compile as _compile

        _compile.register()
        from . import distributed

        distributed.register()
        _registered = True
        if _env.TPU_CHECK.get():
            from . import aot

            aot.check(_env.TPU_CHECK.get(), strict=_env.TPU_CHECK_STRICT.get() not in ("", "0"))
        mode = _env.MODE.get()
        if mode and mode != "strict":
            set_mode(mode)


def metrics() -> dict:
    """Counters: native ops, CPU fallbacks, compiles, cache hits, transfers, buffers."""
    from . import _C

    m = _C._metrics()
    m["native_ops"] = dict(m["native_ops"])
    m["cpu_fallbacks"] = dict(m["cpu_fallbacks"])
    m["native_executions"] = sum(m["native_ops"].values())
    from . import compile as _compile

    m["compile"] = _compile.metrics()
    m["mode"] = get_mode()
    tc = _C._tpu_check_report(False)
    tc["failed"] = len(tc["failed"])
    tc.pop("slowest", None)
    m["tpu_check"] = tc
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
