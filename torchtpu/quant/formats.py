"""Quantize / dequantize helpers and block-scaled matmuls with a plain scale
layout (FP8, MXFP4/MXFP8, NVFP4); see torchtpu.quant for the layouts."""
from __future__ import annotations

import torch

from . import ops  # noqa: F401  (the torchtpu::block_scaled_mm schema)
from .codecs import (
    _EMAX,
    _FP8,
    F4_MAX,
    FP4,
    _check,
    _dequantize_blocks,
    _f32_to_e2m1,
    _fused,
    pack_fp4,
)


# ---------------------------------------------------------------- FP8
@_fused
def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn, *,
                 rowwise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (q, scale) with x ~= q * scale; scale is f32, () or (rows, 1)."""
    _check(dtype in _FP8, f"quantize_fp8: dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True) if rowwise else xf.abs().amax()
    s = torch.finfo(dtype).max / amax.clamp(min=1e-12)
    mx = torch.finfo(dtype).max
    q = (xf * s).clamp(-mx, mx).to(dtype)
    return q, s.reciprocal()


@_fused
def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return (q.float() * scale).to(dtype)


def fp8_matmul(a, a_scale, b, b_scale, out_dtype=torch.bfloat16, bias=None):
    """a (M, K) @ b (N, K).T for fp8 a/b with tensor-wise or row-wise f32
    scales (() or (M, 1) / (N, 1)): torch._scaled_mm."""
    _check(a.dim() == 2 and b.dim() == 2, "fp8_matmul: a and b must be 2-D")
    M, N = a.shape[0], b.shape[0]
    sb = b_scale.reshape(1, N) if b_scale.numel() == N and N != 1 else b_scale
    sa = a_scale if a_scale.numel() == 1 else a_scale.reshape(M, 1)
    if sa.numel() == 1 and sb.numel() == 1:
        sa, sb = sa.reshape(()), sb.reshape(())
    return torch._scaled_mm(a, b.T, sa.float(), sb.float(), bias=bias, out_dtype=out_dtype)


# ---------------------------------------------------------------- MX (e8m0 block scales)
@_fused
def quantize_mx(x: torch.Tensor, elem_dtype: torch.dtype = FP4,
                block_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (q, scale): q float4_e2m1fn_x2 (..., K/2) or fp8 (..., K),
    scale float8_e8m0fnu (..., K/block_size). torchao's to_mx (FLOOR)."""
    _check(elem_dtype in _EMAX, f"quantize_mx: unsupported element dtype {elem_dtype}")
    _check(x.dtype in (torch.float32, torch.bfloat16), f"quantize_mx: x must be float32 or bfloat16, got {x.dtype}")
    K = x.shape[-1]
    _check(K % block_size == 0, f"quantize_mx: the last dim ({K}) must be a multiple of block_size ({block_size})")
    xb = x.float().reshape(*x.shape[:-1], K // block_size, block_size)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    exp = ((amax.view(torch.int32) >> 23) & 255) - 127
    biased = (exp - _EMAX[elem_dtype]).clamp(-127, 128) + 127
    biased = torch.where(amax.isnan(), torch.full_like(biased, 255), biased)
    scale = biased.to(torch.uint8)
    s32 = (biased << 23).view(torch.float32).clamp(min=2.0 ** -126)
    data = xb / s32
    if elem_dtype == FP4:
        q = pack_fp4(_f32_to_e2m1(data.reshape(x.shape)))
    else:
        mx = torch.finfo(elem_dtype).max
        q = data.clamp(-mx, mx).to(elem_dtype).reshape(x.shape)
    return q, scale.squeeze(-1).view(torch.float8_e8m0fnu)


@_fused
def dequantize_mx(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32,
                  block_size: int = 32) -> torch.Tensor:
    return _dequantize_blocks(q, scale, block_size).to(dtype)


def _check_blocked(fn, a, a_scale, b, b_scale, block, scale_dtype, elem_ok):
    _check(a.dim() == 2 and b.dim() == 2, f"{fn}: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    _check(a.dtype == b.dtype and a.dtype in elem_ok,
           f"{fn}: a and b must both be one of {list(elem_ok)}, got {a.dtype} and {b.dtype}")
    _check(a.shape[1] == b.shape[1], f"{fn}: a {tuple(a.shape)} and b {tuple(b.shape)} differ in K")
    K = a.shape[1] * (2 if a.dtype == FP4 else 1)
    _check(K % block == 0, f"{fn}: K = {K} is not a multiple of the block size {block}")
    for name, q, s in (("a_scale", a, a_scale), ("b_scale", b, b_scale)):
        _check(s.dtype == scale_dtype, f"{fn}: {name} must be {scale_dtype}, got {s.dtype}")
        _check(tuple(s.shape) == (q.shape[0], K // block),
               f"{fn}: {name} must have shape {(q.shape[0], K // block)}, got {tuple(s.shape)}")
        _check(s.device == q.device, f"{fn}: {name} is on {s.device}, its operand on {q.device}")


def mx_matmul(a, a_scale, b, b_scale, out_dtype=torch.bfloat16):
    """a (M, K/2) @ b (N, K/2).T for MXFP4 (float4_e2m1fn_x2), or a (M, K) @ b (N, K).T
    for MXFP8; e8m0 scales (M, K/32) and (N, K/32)."""
    _check_blocked("mx_matmul", a, a_scale, b, b_scale, 32, torch.float8_e8m0fnu, (FP4,) + _FP8)
    return torch.ops.torchtpu.block_scaled_mm(a, a_scale, b, b_scale, None, 32, out_dtype)


# ---------------------------------------------------------------- NVFP4
def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The per-tensor f32 scale of a two-level NVFP4 quantization of x."""
    return x.float().abs().amax() / (torch.finfo(torch.float8_e4m3fn).max * F4_MAX)


@_fused
def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q float4_e2m1fn_x2 (M, K/2), scale float8_e4m3fn (M, K/16)),
    x ~= unpack(q) * scale * global_scale. torchao's nvfp4_quantize."""
    _check(x.dtype in (torch.float32, torch.bfloat16), f"quantize_nvfp4: x must be float32 or bfloat16, got {x.dtype}")
    K = x.shape[-1]
    _check(K % 16 == 0, f"quantize_nvfp4: the last dim ({K}) must be a multiple of 16")
    xb = x.float().reshape(*x.shape[:-1], K // 16, 16)
    block = xb.abs().amax(dim=-1) / F4_MAX
    e4 = torch.finfo(torch.float8_e4m3fn)
    if global_scale is None:
        s8 = block.clamp(min=e4.tiny, max=e4.max).to(torch.float8_e4m3fn)
        data = xb * (1.0 / s8.float()).unsqueeze(-1)
    else:
        g = global_scale.float()
        s8 = (block / g).clamp(min=e4.tiny, max=e4.max).to(torch.float8_e4m3fn)
        data = xb * ((1.0 / g) / s8.float()).unsqueeze(-1)
    data = data.clamp(-F4_MAX, F4_MAX).reshape(x.shape)
    return pack_fp4(_f32_to_e2m1(data)), s8


@_fused
def dequantize_nvfp4(q, scale, global_scale=None, dtype=torch.float32):
    v = _dequantize_blocks(q, scale, 16)
    if global_scale is not None:
        v = v * global_scale.float()
    return v.to(dtype)


def nvfp4_matmul(a, a_scale, b, b_scale, global_scale=None, out_dtype=torch.bfloat16):
    """a (M, K/2) @ b (N, K/2).T for NVFP4 with e4m3 scales (M, K/16), (N, K/16),
    times global_scale (f32 scalar: the product of both operands' global scales)."""
    _check_blocked("nvfp4_matmul", a, a_scale, b, b_scale, 16, torch.float8_e4m3fn, (FP4,))
    if global_scale is not None and not isinstance(global_scale, torch.Tensor):
        global_scale = torch.tensor(float(global_scale), device=a.device)
    if global_scale is not None:
        _check(global_scale.numel() == 1, f"nvfp4_matmul: global_scale must be one value, got {tuple(global_scale.shape)}")
        global_scale = global_scale.reshape(()).float().to(a.device)
    return torch.ops.torchtpu.block_scaled_mm(a, a_scale, b, b_scale, global_scale, 16, out_dtype)
