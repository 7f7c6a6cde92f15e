"""OpInfo-driven op coverage: PyTorch's own sample inputs on tpu vs CPU.

Fast tier (default): a representative subset of ~75 OpInfo entries covering every op family,
first 2 samples each, float32; functional, in-place, out= and backward variants. Every
sample must match CPU (or raise the same exception type as CPU), and must run natively
(no CPU fallback) unless the op is listed in KNOWN_FALLBACK. Known wrong results are in
XFAIL with reasons (strict: a fixed op must be removed from the list).

Full sweep (slow): every OpInfo entry in op_db, first 3 samples, float32, correctness only
(fallbacks allowed). Shard it with --shard i/n:

    python -m pytest -q tests/test_opinfo.py                         # fast tier
    python -m pytest -q tests/test_opinfo.py -m slow --shard 0/8     # 1/8 of the full sweep
    python tools/opinfo_sweep.py                                     # full sweep + report
"""
import pytest
import torch

import opinfo_util as U

FAST_OPS = [
    # elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "div.trunc_rounding", "pow",
    "exp", "log", "sqrt", "rsqrt", "abs", "neg", "sigmoid", "tanh", "sin", "cos", "erf", "floor",
    "round", "sign", "clamp", "where", "maximum", "minimum", "remainder", "fmod", "floor_divide",
    "atan2", "eq", "lt", "logical_and", "lerp", "addcmul", "nan_to_num", "isnan", "logaddexp",
    "xlogy", "hypot", "copysign", "rsub", "round.decimals_3",
    # reductions
    "sum", "mean", "amax", "amin", "max.reduction_with_dim", "argmax", "prod", "var", "std",
    "logsumexp", "all", "any", "norm", "cumsum", "var_mean", "aminmax", "nansum", "count_nonzero",
    # matmul
    "mm", "bmm", "matmul", "addmm", "nn.functional.linear",
    # nn
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "softmax", "log_softmax",
    "nn.functional.layer_norm", "nn.functional.conv2d", "nn.functional.max_pool2d",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.embedding",
    "nn.functional.dropout",
    # indexing
    "index_select", "gather", "scatter_add", "masked_fill", "take_along_dim", "__getitem__",
    "index_put",
    # shape
    "cat", "stack", "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "flatten",
    "split", "narrow", "flip", "roll", "repeat", "tril",
    # sort
    "sort", "topk", "argsort",
    # creation
    "zeros_like", "full_like", "arange",
    # fft
    "fft.fft", "fft.ifft", "fft.rfft", "fft.irfft", "fft.fft2", "fft.rfftn", "fft.irfftn", "fft.hfft",
    "fft.ihfft", "fft.fftshift", "stft",  # (istft: complex-only samples; tests/test_ops_fft.py)
]

# op -> reason: wrong results / errors in the first 2 float32 samples (strict xfail).
XFAIL = {
}

# op -> reason: correct, but some variant still runs through the CPU fallback.
KNOWN_FALLBACK = {
}

def _params(keys, fast):
    out = []
    for k in keys:
        marks = []
        if fast and k in XFAIL:
            marks.append(pytest.mark.xfail(reason=XFAIL[k], strict=True))
        out.append(pytest.param(k, marks=marks, id=k))
    return out


def _check(key, limit, require_native, stale_if_native=False):
    op = U.ops_by_key()[key]
    if not U.supports_dtype(op, torch.float32):
        pytest.skip("float32 not supported on cpu")
    bad, fallbacks = U.failures(U.run_op(op, torch.float32, limit=limit))
    assert not bad, "\n".join(bad)
    if require_native:
        assert not fallbacks, f"ran through the CPU fallback: {sorted(fallbacks)}"
    if stale_if_native:
        assert fallbacks, f"{key} now runs natively: remove it from KNOWN_FALLBACK"


def test_fast_ops_exist():
    missing = [k for k in FAST_OPS if k not in U.ops_by_key()]
    assert not missing, f"not in op_db: {missing}"
    stale = [k for k in list(XFAIL) + list(KNOWN_FALLBACK) if k not in FAST_OPS]
    assert not stale, f"xfail/fallback entries not in FAST_OPS: {stale}"


@pytest.mark.parametrize("key", _params(FAST_OPS, fast=True))
def test_opinfo_fast(key):
    _check(key, limit=2, require_native=key not in KNOWN_FALLBACK, stale_if_native=key in KNOWN_FALLBACK)


def _all_keys():
    try:
        return [U.op_key(op) for op in U.all_ops()]
    except Exception:  # noqa: BLE001
        return []


@pytest.mark.slow
@pytest.mark.parametrize("key", _params(_all_keys(), fast=False))
def test_opinfo_full(key):
    _check(key, limit=3, require_native=False)
