"""The ``torch.tpu`` device module (mirrors the torch.cuda API)."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

_initial_seed = None


def _C():
    from . import _C as c

    return c


def _start():
    from . import _device

    _device.ensure_started()


def is_available() -> bool:
    from . import _device

    return _device.plugin_error is None and bool(_device.plugin_path)


def is_initialized() -> bool:
    return _C()._started()


def init() -> None:
    _start()


def device_count() -> int:
    """One process drives one device."""
    return 1 if is_available() else 0


def current_device() -> int:
    return 0


def _check_index(device) -> int:
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"torch.tpu: expected a tpu device, got {device}")
        idx = 0 if device.index is None else device.index
    elif isinstance(device, str):
        return _check_index(torch.device(device))
    elif device is None:
        idx = 0
    else:
        idx = int(device)
    return idx


def set_device(device) -> None:
    """Selects which physical device this process drives (before first use).

    Each process drives exactly one device; after the runtime has started the
    only valid indices are the one in use (exposed as index 0) and the local slot that chose
    it (``set_device(local_rank)`` again, as CUDA code calls it in each rank's process).
    """
    from . import _device

    idx = _check_index(device)
    if _C()._started():
        if idx not in (0, _device.active_slot):
            raise ValueError(f"torch.tpu.set_device({idx}): this process already drives one tpu "
                             f"device (index 0); valid range is [0, 0]. Choose the physical device "
                             f"with TORCHTPU_VISIBLE_DEVICES or set_device before first use.")
        return
    if idx < 0:
        raise ValueError(f"torch.tpu.set_device: invalid device index {idx}")
    _device.requested_index = idx
    _device.configure()


class device:
    """Context manager selecting the device (validation only: one device per process)."""

    def __init__(self, device):
        self.idx = _check_index(device) if device is not None else 0
        if self.idx not in (0, -1):
            raise ValueError(f"torch.tpu.device({self.idx}): valid range is [0, 0] (one device per process)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class device_of(device):
    def __init__(self, obj):
        super().__init__(obj.device if obj.device.type == "tpu" else None)


def synchronize(device=None) -> None:
    _start()
    _C()._synchronize()


def _device_name(info: dict) -> str:
    """The device's name: Cloud TPUs by their kind (e.g. "TPU v5e"), others "platform:kind".

    A name beginning with "TPU" is what torchtitan's peak-FLOPs table
    (torchtitan/tools/utils.py, get_peak_flops) looks for; PJRT reports v5e and
    v6e as "TPU v5 lite" / "TPU v6 lite", named "TPU v5e" / "TPU v6e" here.
    """
    kind = str(info["device_kind"])
    if info["platform_name"] == "tpu" and kind.upper().startswith("TPU"):
        return kind.replace(" lite", "e")
    return f"{info['platform_name']}:{kind}"


def get_device_name(device=None) -> str:
    _start()
    return _device_name(_C()._device_info())


class _DeviceProperties:
    def __init__(self, info: dict, total: int):
        self.name = _device_name(info)
        self.platform_name = info["platform_name"]
        self.platform_version = info["platform_version"]
        self.device_kind = info["device_kind"]
        self.total_memory = total
        self.pjrt_api_version = info["api_version"]
        self.plugin_attributes = dict(info["plugin_attributes"])
        self.multi_processor_count = 1
        self.type = "tpu"

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform_version='{self.platform_version}', "
                f"total_memory={self.total_memory // (1 << 20)}MB)")


def get_device_properties(device=None) -> _DeviceProperties:
    _start()
    return _DeviceProperties(_C()._device_info(), mem_get_info()[1])


def get_device_capability(device=None):
    return (0, 0)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16, torch.float32]


# ---------------------------------------------------------------- RNG
def _gen():
    return _C()._default_generator()


def manual_seed(seed: int) -> None:
    global _initial_seed
    seed = int(seed)
    _initial_seed = seed
    _gen().manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    global _initial_seed
    _initial_seed = _gen().seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return _gen().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return _gen().get_state()


def get_rng_state_all():
    return [get_rng_state()]


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _gen().set_state(new_state)


def set_rng_state_all(new_states) -> None:
    set_rng_state(new_states[0])


def default_generator(idx: int = 0):
    return _gen()


def _is_in_bad_fork() -> bool:
    return False


# ---------------------------------------------------------------- memory
def memory_stats(device=None) -> dict[str, Any]:
    """torch.cuda.memory_stats()'s keys, from torchtpu's own counters.

    Device buffers are freed when their last tensor dies (no caching
    allocator), so reserved == active == allocated bytes; there are no
    pools (large/small split), no retries and no inactive splits. Keys CUDA
    has that mean nothing here are 0. Sorted as CUDA's.
    """
    s = _C()._memory_stats()
    cur, peak = s["allocated_bytes"], s["peak_allocated_bytes"]
    n_cur, n_alloc, n_free = s["live_storages"], s["num_allocs"], s["num_frees"]
    out: dict[str, Any] = {}
    for pool in ("all", "large_pool", "small_pool"):
        big = pool != "small_pool"  # every buffer counts as one "large" pool
        for stat in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes"):
            out[f"{stat}.{pool}.current"] = cur if big else 0
            out[f"{stat}.{pool}.peak"] = peak if big else 0
            out[f"{stat}.{pool}.allocated"] = 0
            out[f"{stat}.{pool}.freed"] = 0
        for stat in ("allocation", "active", "segment"):
            out[f"{stat}.{pool}.current"] = n_cur if big else 0
            out[f"{stat}.{pool}.peak"] = n_cur if big else 0
            out[f"{stat}.{pool}.allocated"] = n_alloc if big else 0
            out[f"{stat}.{pool}.freed"] = n_free if big else 0
        for stat in ("inactive_split", "inactive_split_bytes"):
            for f in ("current", "peak", "allocated", "freed"):
                out[f"{stat}.{pool}.{f}"] = 0
    out.update({
        "num_alloc_retries": 0,
        "num_ooms": s["num_ooms"],
        "num_sync_all_streams": 0,
        "num_device_alloc": n_alloc,
        "num_device_free": n_free,
        "max_split_size": -1,
        "oversize_allocations.current": 0,
        "oversize_allocations.peak": 0,
        "oversize_allocations.allocated": 0,
        "oversize_allocations.freed": 0,
        "oversize_segments.current": 0,
        "oversize_segments.peak": 0,
        "oversize_segments.allocated": 0,
        "oversize_segments.freed": 0,
        "limit_bytes": s["limit_bytes"],
    })
    return dict(sorted(out.items()))


def memory_allocated(device=None) -> int:
    return _C()._memory_stats()["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return _C()._memory_stats()["peak_allocated_bytes"]


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device=None) -> None:
    _C()._reset_peak()


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(torch.device("tpu", 0))


def mem_get_info(device=None) -> tuple[int, int]:
    return tuple(_C()._mem_get_info())


def empty_cache() -> None:
    """Device buffers are freed when their last tensor dies; nothing is cached."""
    import gc

    gc.collect()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    s = memory_stats()
    return "\n".join(f"{k}: {v}" for k, v in s.items())


# ---------------------------------------------------------------- streams / events
class Stream(torch.Stream):
    """A tpu stream (ordering and timing through PJRT completion events)."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device="tpu", priority=priority)

    def __init__(self, *args, **kwargs):
        pass


class _EventMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Event) and obj.device.type == "tpu"


class Event(metaclass=_EventMeta):
    """A tpu event: ``torch.tpu.Event(enable_timing=True)``.

    Returns a plain ``torch.Event`` on the tpu device: torch's C++
    ``Event.elapsed_time`` requires its argument to be exactly a torch.Event,
    so a Python subclass could not be timed against another event.
    ``isinstance(e, torch.tpu.Event)`` holds for every tpu torch.Event.
    """

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return torch.Event(device="tpu", enable_timing=enable_timing, blocking=blocking,
                           interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(torch.device("tpu", 0))


def default_stream(device=None) -> torch.Stream:
    cur = current_stream()
    return torch.Stream(stream_id=0, device_index=cur.device_index, device_type=cur.device_type)


def set_stream(stream) -> None:
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that selects a stream (``torch.cuda.StreamContext``'s contract).

    Reusable and re-entrant like CUDA's: a library may build one context and
    enter it many times (SGLang's scheduler does). ``None`` makes it a no-op.
    """

    def __init__(self, stream):
        self.stream = stream
        self._prev: list = []

    def __enter__(self):
        if self.stream is None:
            return None
        self._prev.append(current_stream())
        set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.stream is None:
            return None
        set_stream(self._prev.pop())
        return None


def stream(s) -> StreamContext:
    """``with torch.tpu.stream(s):`` -- a ``StreamContext`` (reusable), as ``torch.cuda.stream``."""
    return StreamContext(s)


def is_current_stream_capturing() -> bool:
    """No stream captures a graph on tpu (programs are compiled, not captured): always False."""
    return False


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction of the device's memory this process may allocate (1.0: no cap)."""
    _check_index(device)
    cap = _C()._memory_stats()["process_cap_bytes"]
    total = mem_get_info(device)[1]
    if cap <= 0 or not total:
        return 1.0
    return min(1.0, cap / total)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps this process's allocations at ``fraction`` of the device's memory, as on CUDA:
    an allocation past the cap raises ``torch.OutOfMemoryError``; ``mem_get_info`` still
    reports the device's size (TORCHTPU_MEMORY_LIMIT, else the device's capacity)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"torch.tpu.set_per_process_memory_fraction: invalid fraction {fraction!r}, "
                         "expected a number in [0, 1]")
    _check_index(device)
    total = mem_get_info(device)[1]
    # a fraction of 1 is the whole device: no cap (0 bytes would read as none)
    _C()._set_process_memory_cap(0 if fraction >= 1 else max(1, int(total * fraction)))


def memory_usage(device=None) -> int:
    """Bytes of device memory in use by this process (``torch.cuda.memory_usage`` reports a
    percentage from NVML; PJRT has no utilisation counter, so this is the allocated bytes)."""
    return memory_allocated(device)


def device_memory_used(device=None) -> int:
    """Bytes of device memory in use (from PJRT's memory statistics)."""
    free, total = mem_get_info(device)
    return total - free


def memory_cached(device=None) -> int:
    """Deprecated CUDA alias of ``memory_reserved``."""
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated CUDA alias of ``max_memory_reserved``."""
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_stats_as_nested_dict(device=None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in memory_stats(device).items():
        d = out
        parts = k.split(".")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return out


def ipc_collect() -> None:
    """No inter-process memory handles exist on tpu: nothing to collect."""


def can_device_access_peer(device, peer_device) -> bool:
    """One process drives one device; peers exchange data through torch.distributed."""
    _check_index(device)
    _check_index(peer_device)
    return False


def get_arch_list() -> list[str]:
    """CUDA's compiled architectures; torchtpu compiles per program for the plugin's device."""
    return []


def is_tf32_supported() -> bool:
    """TF32 is an NVIDIA format; tpu float32 matmuls follow ``torch.get_float32_matmul_precision()``."""
    return False


def set_sync_debug_mode(debug_mode) -> None:
    """As ``torch.cuda.set_sync_debug_mode``: "default"/0 nothing, "warn"/1 warns and
    "error"/2 raises at each operation that waits for the device to read its memory
    (``.item()``, ``.cpu()``, printing, ``nonzero``)."""
    names = {"default": 0, "warn": 1, "error": 2}
    if isinstance(debug_mode, str):
        if debug_mode not in names:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = names[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError("invalid value of debug_mode, expected 0, 1 or 2")
    _C()._set_sync_debug_mode(int(debug_mode))


def get_sync_debug_mode() -> int:
    return _C()._get_sync_debug_mode()


OutOfMemoryError = torch.OutOfMemoryError


# ---------------------------------------------------------------- amp
class amp:  # torch.tpu.amp namespace compatibility
    @staticmethod
    def autocast(enabled=True, dtype=torch.bfloat16, cache_enabled=True):
        return torch.autocast("tpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "device_of", "synchronize", "get_device_name", "get_device_properties", "get_device_capability",
    "is_bf16_supported", "get_amp_supported_dtype", "manual_seed", "manual_seed_all", "seed", "seed_all",
    "initial_seed", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats",
    "mem_get_info", "empty_cache", "memory_summary", "Stream", "Event",
    "current_stream", "default_stream", "set_stream", "stream", "StreamContext", "is_current_stream_capturing",
    "get_per_process_memory_fraction", "set_per_process_memory_fraction", "memory_usage", "device_memory_used",
    "memory_cached", "max_memory_cached", "reset_max_memory_cached", "memory_stats_as_nested_dict",
    "ipc_collect", "can_device_access_peer", "get_arch_list", "is_tf32_supported", "set_sync_debug_mode",
    "get_sync_debug_mode", "OutOfMemoryError",
]
