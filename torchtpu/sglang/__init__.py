"""torchtpu's SGLang platform plugin (docs/sglang.md).

SGLang finds it through two entry points of the torchtpu distribution:

* ``[project.entry-points."sglang.srt.platforms"] torchtpu = "torchtpu.sglang:platform"``:
  :func:`platform` returns the qualified name of
  :class:`torchtpu.sglang.platform.TpuSRTPlatform`, or None when it should stay out of the way;
* ``[project.entry-points."sglang.srt.plugins"] torchtpu = "torchtpu.sglang:register"``:
  :func:`register` adds torchtpu's attention backend to SGLang's public registries, in every
  process SGLang starts (engine, scheduler, TP workers).

Not named "tpu": SGLang's PlatformEnum has its own TPU value (sglang-jax), and accelerate and
transformers call torch_xla "tpu". Importing this package does not import SGLang.
"""
from __future__ import annotations

import os

PLATFORM_QUALNAME = "torchtpu.sglang.platform.TpuSRTPlatform"
PLUGIN_NAME = "torchtpu"


def platform() -> str | None:
    """SGLang platform-plugin hook (group ``sglang.srt.platforms``).

    Active when torchtpu has a usable "tpu" device, unless this machine has a CUDA device and
    ``SGLANG_PLATFORM`` does not name this plugin: there SGLang's own CUDA platform stays the
    default (torchtpu on the CUDA PJRT plugin is opt-in: ``SGLANG_PLATFORM=torchtpu``)."""
    try:
        import torch

        import torchtpu  # noqa: F401  registers the "tpu" device and torch.tpu
    except Exception:  # torchtpu's extension or its PJRT plugin is unusable here
        return None
    tpu = getattr(torch, "tpu", None)
    if tpu is None or not tpu.is_available():
        return None
    if os.environ.get("SGLANG_PLATFORM") != PLUGIN_NAME and torch.cuda.is_available():
        return None
    return PLATFORM_QUALNAME


def register() -> None:
    """SGLang general-plugin hook (group ``sglang.srt.plugins``): on torchtpu's platform, adds the
    ``torchtpu_paged`` attention backend to SGLang's registry and ``--attention-backend``
    choices. Does nothing on another platform (it does not even import torchtpu there)."""
    from sglang.srt.platforms import current_platform

    if type(current_platform).__module__ != PLATFORM_QUALNAME.rsplit(".", 1)[0]:
        return
    from .attention import register_backend

    register_backend()
