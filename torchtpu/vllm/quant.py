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

MoE: gpt-oss's MXFP4 experts (``quant_method: mxfp4``). vLLM's ``GptOssMxfp4MoEMethod`` picks a
CUDA/ROCm backend in its constructor and is not a ``CustomOp`` (no ``register_oot``), so the
plugin registers a subclass of vLLM's config with vLLM's public ``register_quantization_config``
under vLLM's name ``gpt_oss_mxfp4`` (registered configs take precedence; only on this platform,
by the general plugin), whose only change is the MoE method. That method keeps vLLM's parameters (packed
uint8 blocks, e8m0 scales, bf16 biases: vLLM's gpt-oss loader fills them) and runs the experts
as torchtpu's MoE (torchtpu/vllm/moe.py) on weights dequantized inside the step's program (W4A16,
as gpt-oss runs on Hopper); only the packed tensors stay resident.
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
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.fp8 import Fp8Config, Fp8MoEMethod
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config, GptOssMxfp4MoEMethod
from vllm.platforms import PlatformEnum

from .moe import TpuMoEMixin

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


class TpuGptOssMxfp4MoEMethod(TpuMoEMixin, GptOssMxfp4MoEMethod):
    """gpt-oss MXFP4 experts on tpu: vLLM's parameters and loading, torchtpu's MoE compute."""

    def __init__(self, moe):
        # GptOssMxfp4MoEMethod.__init__ selects a CUDA/ROCm kernel backend (there is none here)
        FusedMoEMethodBase.__init__(self, moe)
        self.weight_dtype = "gpt_oss_mxfp4"
        self.mxfp4_backend = None
        self.experts_cls = None
        self.max_capture_size = moe.max_capture_size
        self.moe_kernel = None
        self.w13_precision_config = self.w2_precision_config = None

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype,
                            moe_parallel_config):
        return FusedMoEMethodBase.maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition,
                                                      act_dtype, moe_parallel_config)

    def process_weights_after_loading(self, layer) -> None:
        for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
            t = getattr(layer, name)
            if t.dtype != torch.uint8:
                raise ValueError(f"torchtpu gpt-oss MXFP4: {name} must be uint8, got {t.dtype}")

    def get_fused_moe_quant_config(self, layer):
        return None

    def expert_weights(self, layer, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed experts ([E, N, K/2] e2m1 pairs, [E, N, K/32] e8m0 exponents) dequantized
        to dtype inside the step's program; only the packed tensors stay resident."""
        from torchtpu.quant import dequantize_mx

        def deq(blocks, scales):
            return dequantize_mx(blocks.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e8m0fnu), dtype)

        return deq(layer.w13_weight, layer.w13_weight_scale), deq(layer.w2_weight, layer.w2_weight_scale)


class TpuGptOssMxfp4Config(GptOssMxfp4Config):
    """vLLM's gpt-oss MXFP4 config with torchtpu's MoE method (see the module doc). Registered
    under vLLM's own name, "gpt_oss_mxfp4": vLLM's expert weight loader recognises gpt-oss's
    fused expert tensors by that name (fused_moe/routed_experts.py:698), so a config of another
    name cannot load them (docs/vllm.md)."""

    def _make_moe_method(self, moe):
        return TpuGptOssMxfp4MoEMethod(moe)


class TpuFp8MoEMethod(TpuMoEMixin, Fp8MoEMethod):
    """FP8 MoE experts with 128x128 block scales (Qwen3-MoE-FP8, DeepSeek-style) on tpu: vLLM's
    parameters and loading (``w13_weight`` / ``w2_weight`` float8_e4m3fn, ``*_weight_scale_inv``),
    torchtpu's MoE compute on experts dequantized inside the step (W8A16; only the fp8 tensors
    stay resident). vLLM picks no FP8 MoE backend out of tree (fused_moe/oracle/fp8.py:541-550)."""

    def process_weights_after_loading(self, layer) -> None:
        if not self.block_quant:
            raise NotImplementedError("torchtpu's vLLM FP8 MoE: per-tensor FP8 experts are not supported yet "
                                      "(block-scaled checkpoints, weight_block_size, are)")
        if self.weight_scale_refine is not None or list(self.moe_block_shape) != list(self.weight_block_size):
            raise NotImplementedError(f"torchtpu's vLLM FP8 MoE: refined block shape {self.moe_block_shape}")

    def get_fused_moe_quant_config(self, layer):
        return None

    def expert_weights(self, layer, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        from torchtpu.quant.modules import dequantize_fp8_blocks

        block = tuple(self.weight_block_size)
        return (dequantize_fp8_blocks(layer.w13_weight, layer.w13_weight_scale_inv, block, dtype),
                dequantize_fp8_blocks(layer.w2_weight, layer.w2_weight_scale_inv, block, dtype))


class TpuFp8Config(Fp8Config):
    """vLLM's FP8 config whose MoE layers get TpuFp8MoEMethod; linears and everything else as
    vLLM's (registered under vLLM's name "fp8", on this platform only)."""

    def get_quant_method(self, layer, prefix):
        method = super().get_quant_method(layer, prefix)
        if type(method) is Fp8MoEMethod:
            return TpuFp8MoEMethod(self, layer)
        return method


def register() -> None:
    """Adds the kernels above to vLLM's per-platform kernel lists (PlatformEnum.OOT) and the
    gpt-oss MXFP4 and FP8 configs to vLLM's quantization methods; once per process, before the engine's config
    is built (vLLM's general plugin hook, torchtpu.vllm:register_extensions)."""
    global _registered
    if _registered:
        return
    register_linear_kernel(TpuBlockFP8Kernel, PlatformEnum.OOT, "fp8_block")
    register_linear_kernel(TpuFP8ScaledMMKernel, PlatformEnum.OOT, "fp8")
    register_linear_kernel(TpuNvFp4Kernel, PlatformEnum.OOT, "nvfp4")
    register_quantization_config(TpuGptOssMxfp4Config.get_name())(TpuGptOssMxfp4Config)
    register_quantization_config(TpuFp8Config.get_name())(TpuFp8Config)
    _registered = True
