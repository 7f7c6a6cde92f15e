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
"""
from __future__ import annotations

import functools

import torch

from . import _quant_ops  # noqa: F401  (the torchtpu::block_scaled_mm schema)

__all__ = [
    "quantize_fp8", "dequantize_fp8", "fp8_matmul",
    "quantize_mx", "dequantize_mx", "mx_matmul",
    "quantize_nvfp4", "dequantize_nvfp4", "nvfp4_matmul", "nvfp4_global_scale",
    "pack_fp4", "unpack_fp4", "QuantLinear", "quantize_linears",
    "BlockFP8Linear", "dequantize_fp8_blocks", "load_fp8_checkpoint", "PackedFP8Experts",
    "PackedMXFP4Experts", "load_mxfp4_checkpoint", "packed_config",
]

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
        from . import mode
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


# ---------------------------------------------------------------- modules
class QuantLinear(torch.nn.Module):
    """nn.Linear with packed low-precision weights (quantized along K).

    ``fmt="fp8"``: float8_e4m3fn weights with row-wise scales; activations
    quantized the same way at each call (dynamic W8A8), one torch._scaled_mm.
    ``fmt="mxfp4"``: MXFP4 weights (e8m0 scales per 32), dequantized to the
    activation dtype inside the call (W4A16, as gpt-oss' MXFP4 checkpoints)."""

    def __init__(self, linear: torch.nn.Linear, fmt: str):
        super().__init__()
        _check(fmt in ("fp8", "mxfp4"), f"QuantLinear: fmt must be 'fp8' or 'mxfp4', got {fmt!r}")
        self.fmt, self.in_features, self.out_features = fmt, linear.in_features, linear.out_features
        w = linear.weight.detach()
        if fmt == "fp8":
            q, s = quantize_fp8(w, rowwise=True)
        else:
            q, s = quantize_mx(w.float() if w.dtype not in (torch.float32, torch.bfloat16) else w)
        self.register_buffer("weight", q)
        self.register_buffer("weight_scale", s)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if self.fmt == "fp8":
            xq, xs = quantize_fp8(x2, rowwise=True)
            bias = None if self.bias is None else self.bias.to(x.dtype)
            y = fp8_matmul(xq, xs, self.weight, self.weight_scale, out_dtype=x.dtype, bias=bias)
        else:
            w = dequantize_mx(self.weight, self.weight_scale, x.dtype)
            y = torch.nn.functional.linear(x2, w, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, fmt={self.fmt}"


def quantize_linears(model: torch.nn.Module, fmt: str, skip=("lm_head",)) -> torch.nn.Module:
    """Replaces every nn.Linear (names containing an entry of ``skip`` excepted)
    by a QuantLinear, in place; returns the model."""
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            full = f"{name}.{cname}" if name else cname
            if isinstance(child, torch.nn.Linear) and not any(s in full for s in skip):
                setattr(mod, cname, QuantLinear(child, fmt))
    return model


# ---------------------------------------------------------------- fine-grained FP8 checkpoints
@_fused
def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                          dtype=torch.bfloat16) -> torch.Tensor:
    """float8 weight (..., N, K) with f32 block scales (..., ceil(N/bn), ceil(K/bk)) -> dtype."""
    *lead, N, K = weight.shape
    bn, bk = block
    want = (*lead, -(-N // bn), -(-K // bk))
    _check(tuple(scale_inv.shape) == want,
           f"dequantize_fp8_blocks: scale_inv must have shape {want} for a "
           f"{tuple(weight.shape)} weight and blocks {tuple(block)}, got {tuple(scale_inv.shape)}")
    gn, gk = scale_inv.shape[-2:]
    s = scale_inv.float()[..., :, None, :, None].expand(*lead, gn, bn, gk, bk)
    s = s.reshape(*lead, gn * bn, gk * bk)[..., :N, :K]
    return (weight.float() * s).to(dtype)


class BlockFP8Linear(torch.nn.Module):
    """Linear with float8_e4m3fn weights and f32 block scales: transformers'
    fine-grained FP8 / DeepSeek checkpoints (`weight`, `weight_scale_inv`).
    ``activations="bf16"``: the weight is dequantized in the call (W8A16, the
    model transformers dequantizes on machines without fp8 kernels);
    ``"fp8"``: activations quantized per 1x128 group and one blockwise
    torch._scaled_mm (W8A8, 128x128 weight blocks only)."""

    def __init__(self, weight, weight_scale_inv, block_size, bias=None, activations="bf16"):
        super().__init__()
        _check(weight.dtype == torch.float8_e4m3fn, f"BlockFP8Linear: weight must be float8_e4m3fn, got {weight.dtype}")
        _check(activations in ("bf16", "fp8"), f"BlockFP8Linear: activations must be 'bf16' or 'fp8', got {activations!r}")
        self.out_features, self.in_features = weight.shape
        self.block_size, self.activations = tuple(block_size), activations
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale_inv", weight_scale_inv.float())
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x):
        x2 = x.reshape(-1, self.in_features)
        if self.activations == "fp8" and self.block_size == (128, 128):
            xq, xs = _quantize_fp8_groups(x2, 128)
            y = torch._scaled_mm(xq, self.weight.T, xs, self.weight_scale_inv.T, out_dtype=x.dtype,
                                 bias=None if self.bias is None else self.bias.to(x.dtype))
        else:
            w = dequantize_fp8_blocks(self.weight, self.weight_scale_inv, self.block_size, x.dtype)
            y = torch.nn.functional.linear(x2, w, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, block_size={self.block_size}, activations={self.activations}"


@_fused
def _quantize_fp8_groups(x: torch.Tensor, group: int):
    M, K = x.shape
    _check(K % group == 0, f"fp8 activations: K = {K} is not a multiple of {group}")
    xg = x.float().reshape(M, K // group, group)
    s = (xg.abs().amax(-1) / 448.0).clamp(min=1e-12)
    q = (xg / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).reshape(M, K)
    return q, s


def load_fp8_checkpoint(path: str, device="tpu", dtype=torch.bfloat16, activations="bf16"):
    """A transformers causal LM saved with a fine-grained FP8 config
    (`quant_method: fp8`, `weight_block_size`), its FP8 linears kept packed
    as BlockFP8Linear and MoE experts as PackedFP8Experts on `device` (a tpu;
    transformers itself dequantizes them to
    bf16 where it has no fp8 kernels): ``from_pretrained`` with packed_config."""
    return _from_pretrained(path, "fp8", device, dtype, activations=activations)


class PackedFP8Experts(torch.nn.Module):
    """A mixture of experts whose stacked weights stay float8_e4m3fn with f32
    block scales: transformers' FP8Experts layout (`gate_up_proj` (E, 2I, H)
    or `up_proj` (E, I, H), `down_proj` (E, H, I), each with a
    `*_scale_inv` (E, ceil(N/bn), ceil(K/bk)); a fused gate_up's scales are
    the gate's blocks then the up's, as the loader concatenates them).
    ``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k))``
    runs without host syncs: with fewer (token, expert) pairs than experts
    (decoding) it dequantizes the pairs' experts and runs two batched
    matmuls; otherwise it dequantizes all experts and runs two
    ``torch._grouped_mm`` over the pairs sorted by expert. ``activation``
    maps the up projection's output (S, 2I) or (S, I) to (S, I) (the
    model's gate: ``act(gate) * up``)."""

    def __init__(self, up, up_scale_inv, down, down_scale_inv, block_size=None, activation=None,
                 has_gate=True):
        super().__init__()
        for name, w in (("up", up), ("down", down)):
            _check(w.dtype == torch.float8_e4m3fn and w.dim() == 3,
                   f"PackedFP8Experts: {name} weights must be (E, N, K) float8_e4m3fn, got {tuple(w.shape)} {w.dtype}")
        self.num_experts = up.shape[0]
        self.has_gate = has_gate
        self.up_name = "gate_up_proj" if has_gate else "up_proj"
        self.block_size = None if block_size is None else tuple(block_size)
        self.activation = activation
        P = functools.partial(torch.nn.Parameter, requires_grad=False)
        setattr(self, self.up_name, P(up))
        setattr(self, f"{self.up_name}_scale_inv", P(up_scale_inv))
        self.down_proj, self.down_proj_scale_inv = P(down), P(down_scale_inv)

    def _dequantized(self, w, s, halves, dtype):
        N, K = w.shape[-2:]
        bn, bk = self.block_size or (N // halves, K)
        if halves == 2 and (N // 2) % bn:  # the gate's and the up's blocks each end in a partial block
            g = s.shape[-2] // 2
            return torch.cat([dequantize_fp8_blocks(w[..., :N // 2, :], s[..., :g, :], (bn, bk), dtype),
                              dequantize_fp8_blocks(w[..., N // 2:, :], s[..., g:, :], (bn, bk), dtype)], -2)
        return dequantize_fp8_blocks(w, s, (bn, bk), dtype)

    def weights(self, which, experts=None, dtype=torch.bfloat16):
        """The dequantized (E, N, K) weights of "up" or "down", or those of
        the experts indexed by `experts` ((S,) -> (S, N, K))."""
        name = self.up_name if which == "up" else "down_proj"
        w, s = getattr(self, name), getattr(self, f"{name}_scale_inv")
        if experts is not None:
            w, s = w[experts], s[experts]
        return self._dequantized(w, s, 2 if which == "up" and self.has_gate else 1, dtype)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        T, H = hidden_states.shape
        k = top_k_index.shape[-1]
        S, E, dtype = T * k, self.num_experts, hidden_states.dtype
        ids = top_k_index.reshape(S)
        if S < E:  # the pairs' experts only
            x = hidden_states[:, None, :].expand(T, k, H).reshape(S, H)
            y = torch.bmm(self.weights("up", ids, dtype), x[:, :, None]).squeeze(-1)
            y = self.activation(y)
            y = torch.bmm(self.weights("down", ids, dtype), y[:, :, None]).squeeze(-1)
        else:  # all experts, pairs grouped by expert
            ids_g, perm = torch.sort(ids)
            counts = (ids[:, None] == torch.arange(E, device=ids.device)).sum(0)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            y = torch._grouped_mm(hidden_states[perm // k], self.weights("up", None, dtype).transpose(-2, -1),
                                  offs=offs)
            y = self.activation(y)
            y = torch._grouped_mm(y, self.weights("down", None, dtype).transpose(-2, -1), offs=offs)
            y = torch.empty_like(y).index_copy_(0, perm, y)
        y = y.float() * top_k_weights.reshape(S, 1).float()
        return y.view(T, k, H).sum(1).to(dtype)

    def extra_repr(self):
        E, N, K = getattr(self, self.up_name).shape
        return f"experts={E}, {self.up_name}=({N}, {K}), block_size={self.block_size}"


# ---------------------------------------------------------------- MXFP4 (gpt-oss) checkpoints
class PackedMXFP4Experts(torch.nn.Module):
    """One stacked expert weight kept as MXFP4 (gpt-oss' `*_blocks` /
    `*_scales`: (E, R, K/32, 16) bytes, element 2i in the low nibble, and
    (E, R, K/32) biased e8m0 exponents). Indexing an expert dequantizes it
    to the (K, R) matrix transformers' experts multiply by."""

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16):
        super().__init__()
        E, R, G, B = blocks.shape
        _check(B == 16 and tuple(scales.shape) == (E, R, G),
               f"PackedMXFP4Experts: blocks (E, R, G, 16) and scales (E, R, G) expected, got "
               f"{tuple(blocks.shape)} and {tuple(scales.shape)}")
        self.dtype = dtype
        self.register_buffer("blocks", blocks.contiguous().view(torch.uint8).reshape(E, R, G * 16).view(FP4))
        self.register_buffer("scales", scales.contiguous().view(torch.uint8).view(E8M0))

    def __getitem__(self, expert):
        return dequantize_mx(self.blocks[expert], self.scales[expert], self.dtype).transpose(-1, -2)

    @property
    def shape(self):
        E, R, H = self.blocks.shape
        return torch.Size((E, 2 * H, R))


E8M0 = torch.float8_e8m0fnu


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
    from . import _quant_hf

    return _quant_hf.packed_config(path, activations, **kwargs)


def _from_pretrained(path, method, device, dtype, **kwargs):
    from transformers import AutoModelForCausalLM

    from . import _quant_hf

    config = _quant_hf.packed_config(path, methods=(method,), **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, config=config, device_map=device, dtype=dtype).eval()
