"""Modules with packed low-precision weights: QuantLinear, BlockFP8Linear
(fine-grained FP8 checkpoints), PackedFP8Experts and PackedMXFP4Experts (MoE
experts kept packed)."""
from __future__ import annotations

import functools

import torch

from .codecs import FP4, _check, _fused
from .formats import dequantize_mx, fp8_matmul, quantize_fp8, quantize_mx


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
