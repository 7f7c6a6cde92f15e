"""Schemas of torchtpu's own ops. Defined before the C++ core binds its
lowerings (torchtpu._register), which then gives them native tpu kernels."""
import torch

from .codecs import _dequantize_blocks

_lib = torch.library.Library("torchtpu", "DEF")
_lib.define(
    "block_scaled_mm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor? global_scale, "
    "int block_size, ScalarType out_dtype) -> Tensor")


@torch.library.register_fake("torchtpu::block_scaled_mm")
def _block_scaled_mm_fake(a, a_scale, b, b_scale, global_scale, block_size, out_dtype):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@torch.library.impl("torchtpu::block_scaled_mm", "CPU")
def _block_scaled_mm_cpu(a, a_scale, b, b_scale, global_scale, block_size, out_dtype):
    da = _dequantize_blocks(a, a_scale, block_size)
    db = _dequantize_blocks(b, b_scale, block_size)
    r = da @ db.T
    if global_scale is not None:
        r = r * global_scale.float()
    return r.to(out_dtype)
