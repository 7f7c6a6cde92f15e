"""torchtpu's vLLM platform plugin (docs/vllm.md).

vLLM finds it through the entry point of the torchtpu distribution
(``[project.entry-points."vllm.platform_plugins"] torchtpu = "torchtpu.vllm:register"``):
``register()`` returns the qualified name of :class:`torchtpu.vllm.platform.TpuPlatform`
when torchtpu has a usable "tpu" device, else None (vLLM then picks another platform).

Importing this package does not import vLLM; ``torchtpu.vllm.platform`` does.
"""
from __future__ import annotations

PLATFORM_QUALNAME = "torchtpu.vllm.platform.TpuPlatform"


def register() -> str | None:
    """vLLM platform-plugin hook (group ``vllm.platform_plugins``)."""
    try:
        import torch

        import torchtpu  # noqa: F401  registers the "tpu" device and torch.tpu
    except Exception:  # torchtpu's extension or its PJRT plugin is unusable here
        return None
    tpu = getattr(torch, "tpu", None)
    if tpu is None or not tpu.is_available():
        return None
    return PLATFORM_QUALNAME


def register_extensions() -> None:
    """vLLM general-plugin hook (group ``vllm.general_plugins``), run by vLLM in every process
    before it builds the engine's config or a model: on torchtpu's platform, registers the
    quantized kernels and methods (torchtpu/vllm/quant.py) and the MoE method
    (torchtpu/vllm/moe.py) with vLLM's public registries. Does nothing on another platform."""
    from vllm.platforms import current_platform

    # by module, before importing anything of torchtpu: on another platform (CUDA, or vLLM's
    # own "tpu" platform, tpu-inference) this plugin must not even load torchtpu
    if type(current_platform).__module__ != PLATFORM_QUALNAME.rsplit(".", 1)[0]:
        return
    from .moe import register as register_moe
    from .quant import register as register_quant

    register_moe()
    register_quant()
