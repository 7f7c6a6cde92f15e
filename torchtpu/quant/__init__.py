"""Low-precision formats on tpu: quantize/dequantize helpers and
block-scaled matmuls with a plain scale layout.

Layouts (the same bits as torchao's MX and NVFP4 tensors, so checkpoints
interoperate):

* FP8: ``q = saturate(x * s)`` in float8 with ``s = max(dtype) / amax``
  (per tensor or per row), dequantized as ``q * scale`` where
  ``scale = 1 / s`` (torch._scaled_mm's convention).
* MXFP4 / MXFP8 (OCP microscaling): blocks of 32 consecutive elements along
  the last dim share one float8_e8m0fnu scale ``2**(floor(log2(amax)) - emax)``
  (emax 2 for e2m1, 8 for e4m3). FP4 values are float4_e2m1fn_x2 with
  element 2i in the low nibble of byte i. Scales (..., K/32).
* NVFP4: blocks of 16 share a float8_e4m3fn scale ``amax / 6`` (divided by an
  optional per-tensor f32 scale, ``amax_tensor / (448 * 6)``); values
  e2m1 as above. Scales (..., K/16).

``mx_matmul`` / ``nvfp4_matmul`` / ``fp8_matmul`` return ``a @ b.T`` for
``a`` (M, K) and ``b`` (N, K) quantized along K; on tpu they run as one native
program (``torchtpu::block_scaled_mm`` / ``torch._scaled_mm``).

Layers, bottom up: ``codecs`` (FP4 packing, block dequantization), ``ops``
(the ``torchtpu::block_scaled_mm`` schema), ``formats`` (quantize /
dequantize / matmul helpers), ``modules`` (packed-weight modules). The
checkpoint loaders below build transformers' ``from_pretrained`` with
torchtpu's quantizers, which live with the other Hugging Face integrations
in ``torchtpu.hf.quantizers`` (imported when called: transformers is
optional); that module imports ``modules``, never this one's loaders.
"""
from __future__ import annotations

import torch

from .codecs import F4_MAX, FP4, pack_fp4, unpack_fp4  # noqa: F401
from .formats import (  # noqa: F401
    dequantize_fp8,
    dequantize_mx,
    dequantize_nvfp4,
    fp8_matmul,
    mx_matmul,
    nvfp4_global_scale,
    nvfp4_matmul,
    quantize_fp8,
    quantize_mx,
    quantize_nvfp4,
)
from .modules import (  # noqa: F401
    E8M0,
    BlockFP8Linear,
    PackedFP8Experts,
    PackedMXFP4Experts,
    QuantLinear,
    dequantize_fp8_blocks,
    quantize_linears,
)

__all__ = [
    "quantize_fp8", "dequantize_fp8", "fp8_matmul",
    "quantize_mx", "dequantize_mx", "mx_matmul",
    "quantize_nvfp4", "dequantize_nvfp4", "nvfp4_matmul", "nvfp4_global_scale",
    "pack_fp4", "unpack_fp4", "QuantLinear", "quantize_linears",
    "BlockFP8Linear", "dequantize_fp8_blocks", "load_fp8_checkpoint", "PackedFP8Experts",
    "PackedMXFP4Experts", "load_mxfp4_checkpoint", "packed_config",
]


def load_fp8_checkpoint(path: str, device="tpu", dtype=torch.bfloat16, activations="bf16"):
    """A transformers causal LM saved with a fine-grained FP8 config
    (`quant_method: fp8`, `weight_block_size`), its FP8 linears kept packed
    as BlockFP8Linear and MoE experts as PackedFP8Experts on `device` (a tpu;
    transformers itself dequantizes them to
    bf16 where it has no fp8 kernels): ``from_pretrained`` with packed_config."""
    return _from_pretrained(path, "fp8", device, dtype, activations=activations)


def load_mxfp4_checkpoint(path: str, device="tpu", dtype=torch.bfloat16):
    """A transformers MXFP4 checkpoint (gpt-oss format: experts'
    `{gate_up,down}_proj_blocks` / `_scales`) with the expert weights kept
    packed (PackedMXFP4Experts) on `device` (a tpu); each expert is dequantized when
    the experts' eager loop uses it (transformers dequantizes the whole model
    to bf16 where it has no MXFP4 kernels): ``from_pretrained`` with packed_config."""
    return _from_pretrained(path, "mxfp4", device, dtype)


# ---------------------------------------------------------------- transformers' from_pretrained
def packed_config(path: str, activations: str = "bf16", **kwargs):
    """The config of a transformers FP8 (`quant_method: fp8`) or MXFP4
    (`mxfp4`, gpt-oss) checkpoint, for
    ``AutoModelForCausalLM.from_pretrained(path, config=packed_config(path), device_map="tpu")``
    to keep the weights packed on tpu (BlockFP8Linear, PackedFP8Experts for
    MoE experts / PackedMXFP4Experts;
    load_fp8_checkpoint / load_mxfp4_checkpoint load this way) instead of
    dequantizing them to bf16. Its quantization_config names torchtpu's
    quantizers (registered with transformers' ``register_quantizer``);
    ``activations`` as in BlockFP8Linear (experts stay W8A16); ``kwargs`` go
    to AutoConfig.from_pretrained."""
    from ..hf import quantizers  # transformers is an optional dependency

    return quantizers.packed_config(path, activations, **kwargs)


def _from_pretrained(path, method, device, dtype, **kwargs):
    from transformers import AutoModelForCausalLM

    from ..hf import quantizers

    config = quantizers.packed_config(path, methods=(method,), **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, config=config, device_map=device, dtype=dtype).eval()
