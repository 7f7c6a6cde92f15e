"""Low-precision codecs, the bottom of torchtpu.quant: FP4 (e2m1) packing and
conversions, block dequantization, argument checks, and the decorator that
records a helper's ops into one program on tpu. Imports nothing of torchtpu
but the eager modes."""
from __future__ import annotations

import functools

import torch

FP4 = torch.float4_e2m1fn_x2
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
F4_MAX = 6.0
_EMAX = {FP4: 2, torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}


def _fused(fn):
    """On tpu, record the helper's ops into one program (defer_and_fuse)."""
    @functools.wraps(fn)
    def run(x, *args, **kwargs):
        if x.device.type != "tpu":
            return fn(x, *args, **kwargs)
        from .._modes import mode
        with mode("defer_and_fuse"):
            return fn(x, *args, **kwargs)
    return run


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# ---------------------------------------------------------------- fp4 codes
def _f32_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) of f32 values: round to nearest even,
    saturating at ±6; the sign bit is kept (-0.0 -> 0x8)."""
    a = x.abs()
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
            + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8) + (a >= 3.5).to(torch.uint8)
            + (a > 5.0).to(torch.uint8))
    sign = (x.view(torch.int32) < 0).to(torch.uint8) * 8
    return code + sign


def _e2m1_to_f32(code: torch.Tensor) -> torch.Tensor:
    """e2m1 codes -> f32, built from the bits: 2^(e-1) * (1 + m/2), or m/2 when e == 0."""
    c = code.to(torch.int32)
    e, m = (c >> 1) & 3, c & 1
    bits = torch.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))
    return (bits | ((c & 8) << 28)).view(torch.float32)


@_fused
def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """(..., K) e2m1 codes -> (..., K/2) float4_e2m1fn_x2, element 2i in the low nibble."""
    _check(codes.shape[-1] % 2 == 0, f"pack_fp4: the last dim ({codes.shape[-1]}) must be even")
    c = codes.to(torch.uint8)
    return (c[..., ::2] | (c[..., 1::2] << 4)).view(FP4)


@_fused
def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """(..., K/2) float4_e2m1fn_x2 -> (..., K) float32 values."""
    _check(packed.dtype == FP4, f"unpack_fp4: expected float4_e2m1fn_x2, got {packed.dtype}")
    u = packed.view(torch.uint8)
    codes = torch.stack([u & 15, u >> 4], dim=-1).flatten(-2)
    return _e2m1_to_f32(codes)


def _values(q: torch.Tensor) -> torch.Tensor:
    return unpack_fp4(q) if q.dtype == FP4 else q.float()


def _dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    v = _values(q)
    return (v.unflatten(-1, (-1, block)) * scale.float().unsqueeze(-1)).flatten(-2)
