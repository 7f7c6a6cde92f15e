"""Quantized linear kernels for vLLM on tpu, registered through vLLM's public kernel registry
(``vllm.model_executor.kernels.linear.register_linear_kernel``, PlatformEnum.OOT).

vLLM's quantization methods (``fp8``, ``compressed-tensors``, ``modelopt``, ...) create the
packed parameters and pick a kernel per layer from a per-platform list; an out-of-tree platform
starts with an empty list, so without these every quantized checkpoint fails with "Failed to find
a kernel". Each kernel keeps the checkpoint's packed weights on the device and runs torchtpu's
native low-precision matmuls (``torch._scaled_mm``, ``torchtpu::block_scaled_mm``).

Kernels, by vLLM's kernel type:

* ``fp8_block`` -- fine-grained FP8 (``quant_method: fp8`` with ``weight_block_size: [128, 128]``;
  compressed-tensors FP8 block): activations quantized per 1x128 group, one blockwise
  ``torch._scaled_mm`` (vLLM's own torch kernel, gated here to tpu).
* ``fp8`` -- per-tensor / per-channel FP8 weights with static or dynamic per-tensor / per-token
  activations (``quant_method: fp8`` without blocks, compressed-tensors FP8): ``torch._scaled_mm``
  with the scales as its tensor-wise / row-wise operands.
* ``nvfp4`` -- NVFP4 W4A4 (compressed-tensors ``nvfp4-pack-quantized``, ModelOpt NVFP4): packed
  e2m1 weights with e4m3 scales per 16 and a global scale; activations quantized to NVFP4 with
  the checkpoint's input global scale, then one ``torchtpu::block_scaled_mm`` on the packed
  operands (``torchtpu.quant.nvfp4_matmul``).
"""
from __future__ import annotations

import torch

from vllm.model_executor.kernels.linear import (
    FP8ScaledMMLinearKernel,
    FP8ScaledMMLinearLayerConfig,
    register_linear_kernel,
)
from vllm.model_executor.kernels.linear import NvFp4LinearKernel, NvFp4LinearLayerConfig
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import BlockWiseTorchFP8ScaledMMLinearKernel
from vllm.platforms import PlatformEnum

_registered = False


def _on_tpu() -> tuple[bool, str | None]:
    from vllm.platforms import current_platform

    from .platform import TpuPlatform

    if isinstance(current_platform, TpuPlatform):
        return True, None
    return False, "requires torchtpu's vLLM platform (device 'tpu')."


class TpuBlockFP8Kernel(BlockWiseTorchFP8ScaledMMLinearKernel):
    """DeepSeek-style FP8: 1x128 activation groups x 128x128 weight blocks, one blockwise
    ``torch._scaled_mm`` (torchtpu lowers it to an f8 x f8 -> f32 dot per K block)."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        return _on_tpu()


class TpuFP8ScaledMMKernel(FP8ScaledMMLinearKernel):
    """FP8 weights with one scale per tensor or per output channel; activations quantized per
    tensor or per token (dynamic), or with the checkpoint's static per-tensor scale."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        return _on_tpu()

    @classmethod
    def can_implement(cls, c: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        a, w = c.activation_quant_key.scale.group_shape, c.weight_quant_key.scale.group_shape
        if not (a.is_per_tensor() or a.is_per_token()):
            return False, f"activation scales per tensor or per token only, got group shape {a}."
        if not (w.is_per_tensor() or w.is_per_channel()):
            return False, f"weight scales per tensor or per channel only, got group shape {w}."
        return True, None

    def apply_scaled_mm(self, *, A: torch.Tensor, B: torch.Tensor, out_dtype: torch.dtype,
                        As: torch.Tensor, Bs: torch.Tensor, bias: torch.Tensor | None,
                        output_shape: list) -> torch.Tensor:
        # A (M, K) fp8, B (K, N) fp8 (vLLM stores the weight transposed after loading);
        # As () / (1,) / (M, 1); Bs () / (1,) / (N,) / (N, 1).
        M, N = A.shape[0], B.shape[1]
        sa = As.reshape(()) if As.numel() == 1 else As.reshape(M, 1)
        sb = Bs.reshape(()) if Bs.numel() == 1 else Bs.reshape(1, N)
        if sa.dim() != sb.dim():  # one tensor-wise, one row-wise: both row-wise
            sa, sb = sa.expand(M, 1) if sa.dim() == 0 else sa, sb.expand(1, N) if sb.dim() == 0 else sb
        out = torch._scaled_mm(A, B, scale_a=sa.float(), scale_b=sb.float(), bias=bias, out_dtype=out_dtype)
        return out.view(*output_shape)

    def get_output_padding(self) -> int | None:
        return None


class TpuNvFp4Kernel(NvFp4LinearKernel):
    """NVFP4 W4A4 on the packed operands. The quantization method leaves on the layer (vLLM's
    contract, as its emulation kernel reads it): ``weight`` uint8 (N, K/2), ``weight_scale``
    e4m3 (N, K/16), ``weight_global_scale`` and ``input_global_scale`` (dequantizing
    multipliers) and ``alpha`` (their product)."""

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        return _on_tpu()

    @classmethod
    def can_implement(cls, config: NvFp4LinearLayerConfig) -> tuple[bool, str | None]:
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if layer.weight_scale.dtype != torch.float8_e4m3fn or layer.weight.dtype != torch.uint8:
            raise ValueError(f"torchtpu NVFP4 kernel: expected uint8 weights with float8_e4m3fn block "
                             f"scales, got {layer.weight.dtype} / {layer.weight_scale.dtype}")

    def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
        from torchtpu.quant import nvfp4_matmul, quantize_nvfp4

        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = quantize_nvfp4(x2, layer.input_global_scale)
        w = layer.weight.view(torch.float4_e2m1fn_x2)
        out = nvfp4_matmul(xq, xs, w, layer.weight_scale, global_scale=layer.alpha, out_dtype=x.dtype)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def register() -> None:
    """Adds the kernels above to vLLM's per-platform kernel lists (PlatformEnum.OOT); once per
    process, before the model is built."""
    global _registered
    if _registered:
        return
    register_linear_kernel(TpuBlockFP8Kernel, PlatformEnum.OOT, "fp8_block")
    register_linear_kernel(TpuFP8ScaledMMKernel, PlatformEnum.OOT, "fp8")
    register_linear_kernel(TpuNvFp4Kernel, PlatformEnum.OOT, "nvfp4")
    _registered = True
