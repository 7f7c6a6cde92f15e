"""Mixture-of-experts ops: torch.histc (integer counts per expert) and
torch._grouped_mm (one matmul per expert over sorted tokens), natively in
every float dtype, eager and compiled, against CPU references."""
import pytest
import torch

import torchtpu


@pytest.fixture(autouse=True)
def _no_fallback():
    torchtpu.reset_metrics()
    yield
    assert torchtpu.metrics()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bins,lo,hi", [(10, 0, 0), (7, -1, 2), (100, -3, 3), (5, 1, 1), (3, 0.5, 0.5)])
def test_histc_float_matches_cpu(dtype, bins, lo, hi):
    torch.manual_seed(0)
    # CPU counts f16/bf16 histograms in that dtype (bf16: 256 + 1 == 256), so
    # they stay below 256 per bin there.
    n = 999 if dtype in (torch.float32, torch.float64) else 200
    x = (torch.randn(n) * 3).to(dtype)
    x[::97] = float("nan")  # NaN is never counted
    x[5] = 3.0  # an element on the closed upper edge
    want = torch.histc(x, bins, lo, hi) if not (lo == hi) else None
    if want is None:  # CPU raises on NaN extrema; compare on the NaN-free data
        x = x[~x.isnan()]
        want = torch.histc(x, bins, lo, hi)
    got = torch.histc(x.to("tpu"), bins, lo, hi)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def _histc_int_reference(x, bins, lo, hi):
    # CUDA's integer histc: range from min/max (or the data), bin in int64.
    lo, hi = int(lo), int(hi)
    if lo == hi:
        lo, hi = int(x.min()), int(x.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    x = x.long()
    keep = (x >= lo) & (x <= hi)
    b = ((x[keep] - lo) * bins) // (hi - lo)
    b = b.clamp(max=bins - 1)
    return torch.bincount(b, minlength=bins).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("bins,lo,hi", [(8, 0, 7), (8, 0, 0), (3, 2, 5), (4, 9, 9)])
def test_histc_int_counts_like_cuda(dtype, bins, lo, hi):
    torch.manual_seed(1)
    x = torch.randint(0, 10, (257,), dtype=dtype)
    got = torch.histc(x.to("tpu"), bins=bins, min=lo, max=hi)
    assert got.dtype == dtype
    want = _histc_int_reference(x, bins, lo, hi).to(dtype)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_histc_tokens_per_expert_as_transformers_counts():
    # transformers' MoE: torch.histc(expert_ids.int(), bins=E, min=0, max=E - 1)
    e = 6
    ids = torch.randint(0, e, (64, 2))
    got = torch.histc(ids.to("tpu").int(), bins=e, min=0, max=e - 1)
    assert torch.equal(got.cpu().long(), torch.bincount(ids.flatten(), minlength=e))


def test_histc_nonfinite_range_is_poisoned_and_bad_bins_raise():
    got = torch.histc(torch.tensor([1.0, float("inf")], device="tpu"), bins=4)
    assert got.isnan().all()  # CPU raises "range of [1, inf] is not finite"
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(torch.ones(3, device="tpu"), bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(torch.ones(3, device="tpu"), bins=3, min=2, max=1)


def _grouped_ref(a, b, offs):
    """Plain CPU PyTorch: one matmul per group, in float64."""
    a, b = a.double(), b.double()
    if offs is None:
        return a @ b
    ends = offs.tolist()
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], dtype=a.dtype)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[s:e] = a[s:e] @ b[g]
    elif a.dim() == 3 and b.dim() == 2:
        out = torch.zeros(a.shape[1], b.shape[1], dtype=a.dtype)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[:, s:e] = a[g] @ b[:, s:e]
    else:
        out = torch.zeros(len(ends), a.shape[0], b.shape[1], dtype=a.dtype)
        for g, (s, e) in enumerate(zip(starts, ends)):
            out[g] = a[:, s:e] @ b[s:e]
    return out


OFFS = [3, 3, 7, 10]  # an empty group, and rows past the last end (zeros)
GROUPED_CASES = {
    "2dx3d": ((12, 5), (4, 5, 6), OFFS),
    "3dx2d": ((4, 3, 5), (5, 10), OFFS),
    "2dx2d": ((3, 10), (10, 6), OFFS),
    "3dx3d": ((4, 3, 5), (4, 5, 6), None),
    # many rows per group: the tiled lowering (csrc/ops/matmul.cpp), with an empty first and
    # middle group, groups smaller and larger than a tile, rows past the last end
    "2dx3d_tiled": ((300, 16), (8, 16, 12), [0, 37, 37, 100, 180, 181, 250, 290]),
    "2dx2d_tiled": ((6, 300), (300, 12), [0, 37, 37, 100, 180, 181, 250, 290]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(GROUPED_CASES))
def test_grouped_mm_forward_backward(case, dtype):
    sa, sb, offs = GROUPED_CASES[case]
    torch.manual_seed(0)
    a, b = torch.randn(sa).to(dtype), torch.randn(sb).to(dtype)
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    at, bt = a.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
    out = torch._grouped_mm(at, bt, None if o is None else o.to("tpu"))
    ac, bc = a.double().requires_grad_(), b.double().requires_grad_()
    want = _grouped_ref(ac, bc, o)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=3e-2)
    assert out.dtype == dtype and out.shape == want.shape
    torch.testing.assert_close(out.cpu().double(), want, **tol)
    gy = torch.randn(want.shape)
    out.backward(gy.to(dtype).to("tpu"))
    want.backward(gy.to(dtype).double())
    torch.testing.assert_close(at.grad.cpu().double(), ac.grad, **tol)
    torch.testing.assert_close(bt.grad.cpu().double(), bc.grad, **tol)


def test_grouped_mm_out_dtype_and_errors():
    a = torch.randn(12, 8, dtype=torch.bfloat16, device="tpu")
    b = torch.randn(4, 8, 6, dtype=torch.bfloat16, device="tpu")
    offs = torch.tensor(OFFS, dtype=torch.int32, device="tpu")
    out = torch._grouped_mm(a, b, offs, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu().double(), _grouped_ref(a.cpu(), b.cpu(), offs.cpu()), rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError, match="_grouped_mm: contraction dimension"):
        torch._grouped_mm(a, b[:, :5], offs)
    with pytest.raises(RuntimeError, match="_grouped_mm: offs has 2 groups"):
        torch._grouped_mm(a, b, offs[:2])
    with pytest.raises(RuntimeError, match="_grouped_mm: offs is required"):
        torch._grouped_mm(a, b)
    with pytest.raises(RuntimeError, match="same floating dtype"):
        torch._grouped_mm(a.float(), b, offs)


def test_moe_ops_compiled():
    # Compiled graphs take shapes from torch's meta functions: _grouped_mm's
    # accepts only bf16 with 16-byte aligned strides (as on CPU), so bf16 here.
    e = 4

    def moe(x, w, ids):
        counts = torch.histc(ids.int(), bins=e, min=0, max=e - 1)
        offs = torch.cumsum(counts, 0).int()
        return torch._grouped_mm(x, w, offs), counts

    torch.manual_seed(0)
    ids = torch.sort(torch.randint(0, e, (16,))).values
    x = torch.randn(16, 8, dtype=torch.bfloat16)
    w = torch.randn(e, 8, 8, dtype=torch.bfloat16)
    before = dict(torchtpu.metrics()["compile"])
    f = torch.compile(moe, backend="tpu", fullgraph=True, dynamic=False)
    out, counts = f(x.to("tpu"), w.to("tpu"), ids.to("tpu"))
    assert torch.equal(counts.cpu().long(), torch.bincount(ids, minlength=e))
    offs = torch.cumsum(torch.bincount(ids, minlength=e), 0).int()
    torch.testing.assert_close(out.cpu().double(), _grouped_ref(x, w, offs), rtol=2e-2, atol=3e-2)
    m = torchtpu.metrics()["compile"]
    assert m["graphs_compiled"] == before["graphs_compiled"] + 1, m
    assert m["graph_fallbacks"] == before["graph_fallbacks"], m
