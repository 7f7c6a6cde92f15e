"""Start-up state: which PJRT plugin and which physical device this process
uses, and starting the runtime on first use. Below the device module and the
package's registration (torchtpu/__init__.py), which both read it."""
from __future__ import annotations

import os

from . import _env, _plugin
from ._version import __version__

plugin_kind = None
plugin_path = None
plugin_error = None
requested_index = None
active_slot = 0  # the local slot this process drives (set_device's index, LOCAL_RANK, or 0)


def configure() -> None:
    global plugin_kind, plugin_path, plugin_error, active_slot
    from . import _C

    plugin_error = None

    try:
        plugin_kind, plugin_path = _plugin.resolve()
    except ImportError as e:  # reported on first use of the device
        plugin_error = e
        plugin_kind, plugin_path = None, ""
    if plugin_kind == "tpu" and not hardware_present():
        # libtpu would ask the cloud metadata server for minutes, then fail
        plugin_error = ImportError(
            "torchtpu: TORCHTPU_PLUGIN=tpu but this host has no TPU (no /dev/accel* or /dev/vfio device): "
            "it needs a Cloud TPU VM; elsewhere use TORCHTPU_PLUGIN=cpu or cuda (libtpu still compiles for a "
            "TPU topology here: torchtpu.aot)")
        plugin_kind, plugin_path = None, ""
    lr = os.environ.get("LOCAL_RANK")
    active_slot = local_slot(lr, requested_index)
    try:
        index = physical_index(_env.VISIBLE_DEVICES.get(), lr, requested_index)
    except ValueError as e:  # reported on first use of the device, like a missing plugin
        plugin_error, index = e, 0
    count = int(_env.CPU_DEVICES.get() or "1")
    if plugin_kind == "cpu":
        count = max(count, index + 1)
    _C._configure(plugin_path or "", plugin_kind or "", count, index,
                  _env.parse_bytes(_env.MEMORY_LIMIT.get()), _env.cache_dir(), __version__,
                  str(plugin_error) if plugin_error is not None else "")


def local_slot(local_rank: str | None, requested: int | None) -> int:
    """``torch.tpu.set_device(i)``'s index if called, else ``LOCAL_RANK`` (set by torchrun), else 0."""
    if requested is not None:
        return requested
    return int(local_rank) if local_rank not in (None, "") else 0


def physical_index(visible: str, local_rank: str | None, requested: int | None) -> int:
    """The physical device this process drives: its local slot (:func:`local_slot`) itself, or
    ``TORCHTPU_VISIBLE_DEVICES``'s one index, or the slot's entry of its list ("4,5,6,7"), like
    CUDA_VISIBLE_DEVICES with ``cuda.set_device(local_rank)``.
    """
    slot = local_slot(local_rank, requested)
    devs = [int(x) for x in visible.split(",") if x.strip()]
    if not devs:
        return slot
    if len(devs) == 1:
        return devs[0]
    if not 0 <= slot < len(devs):
        raise ValueError(f"torchtpu: device slot {slot} (LOCAL_RANK or torch.tpu.set_device) is out of range "
                         f"for TORCHTPU_VISIBLE_DEVICES={visible!r} ({len(devs)} devices)")
    return devs[slot]


def hardware_present() -> bool:
    """Whether the chosen plugin's devices can exist on this host, without starting
    the plugin (CUDA's is_available() creates no context either): libtpu needs a
    TPU VM's accelerator device nodes (/dev/accel*, or /dev/vfio/N on newer chips).
    An installed libtpu on another host (torchtpu.aot compiles with it) is no device."""
    import glob

    if plugin_kind == "tpu":
        return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    return True


def ensure_started() -> None:
    from . import _C

    if _C._started():
        return
    if plugin_error is not None:
        raise plugin_error
    try:
        _C._start()
    except RuntimeError as e:
        msg = str(e)
        if plugin_kind == "tpu":
            msg += " (TORCHTPU_PLUGIN=tpu needs a Cloud TPU host; on other machines use cpu or cuda)"
        raise RuntimeError(msg) from None
