"""OpInfo samples through torch.compile(backend="tpu"): the `compiled` variant of opinfo_util.

A bounded subset (~45 OpInfo entries across the op families), first 2 float32 samples each.
Every sample must match eager CPU (or raise the same exception type) and its graph must be
lowered into a compiled StableHLO program (no eager graph fallback, no graph break) unless
the op is listed in KNOWN_GRAPH_FALLBACK with the reason (strict: an op in the list that now
compiles fails, so the list cannot go stale). Full sweep of the variant:

    python tools/opinfo_sweep.py --variants compiled --ops 'add,nn.functional.*' --tag compiled
"""
import pytest
import torch

import opinfo_util as U

COMPILE_OPS = [
    # elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "exp", "log", "sqrt", "rsqrt", "abs",
    "sigmoid", "tanh", "clamp", "maximum", "remainder", "lerp", "addcmul", "nan_to_num", "eq",
    "logical_and",
    # reductions
    "sum", "mean", "amax", "max.reduction_with_dim", "argmax", "var", "logsumexp", "cumsum",
    # matmul
    "mm", "bmm", "matmul", "addmm", "nn.functional.linear",
    # nn
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.relu",
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.cross_entropy",
    "nn.functional.embedding", "nn.functional.dropout",
    # indexing
    "index_select", "gather", "scatter_add", "__getitem__", "index_put", "take_along_dim",
    # shape
    "cat", "stack", "reshape", "permute", "transpose", "expand", "squeeze", "flatten", "split",
    "narrow", "flip", "roll", "repeat", "tril",
    # where / masked
    "where", "masked_fill",
    # sort / creation
    "sort", "topk", "zeros_like", "full_like",
    # fft
    "fft.fft", "fft.rfft", "fft.irfft", "fft.fft2", "fft.rfftn", "fft.hfft", "fft.ihfft",
]

# op -> reason: wrong results / errors in the compiled variant (strict xfail).
XFAIL = {
}

# op -> reason: correct, but some sample's graph still runs eagerly (graph fallback / break).
KNOWN_GRAPH_FALLBACK = {
    "index_put": "boolean-mask indices (data-dependent shape): the lowering rejects them, the graph "
                 "runs eagerly",
    "narrow": "a tensor `start` is read with .item(): Dynamo graph break (data-dependent operator)",
}

def test_compile_ops_exist():
    missing = [k for k in COMPILE_OPS if k not in U.ops_by_key()]
    assert not missing, f"not in op_db: {missing}"
    stale = [k for k in list(XFAIL) + list(KNOWN_GRAPH_FALLBACK) if k not in COMPILE_OPS]
    assert not stale, f"xfail/fallback entries not in COMPILE_OPS: {stale}"


def _params():
    out = []
    for k in COMPILE_OPS:
        marks = [pytest.mark.xfail(reason=XFAIL[k], strict=True)] if k in XFAIL else []
        out.append(pytest.param(k, marks=marks, id=k))
    return out


@pytest.mark.parametrize("key", _params())
def test_opinfo_compiled(key):
    op = U.ops_by_key()[key]
    if not U.supports_dtype(op, torch.float32):
        pytest.skip("float32 not supported on cpu")
    bad, fallbacks = U.failures(U.run_op(op, torch.float32, limit=2, variants=("compiled",)))
    assert not bad, "\n".join(bad)
    if key in KNOWN_GRAPH_FALLBACK:
        assert fallbacks, f"{key} now compiles natively: remove it from KNOWN_GRAPH_FALLBACK"
    else:
        assert not fallbacks, f"graph ran eagerly / through the CPU fallback: {sorted(fallbacks)}"
