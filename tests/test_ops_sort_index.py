"""Sort/select, data-dependent shapes (nonzero, masked_select, unique, boolean
indexing), indexing extras, embedding_bag, shape extras and creation ops:
tpu vs CPU (values, indices and gradients), with no CPU fallbacks."""
import functools
import warnings

import pytest
import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", message=".*native tpu lowering.*")
DEV = "tpu"


from optest import check as _check  # noqa: E402

# fn(*inputs); grad=(positions of the inputs to differentiate), none by default
check = functools.partial(_check, pass_dev=False, grad=())


torch.manual_seed(0)
X = torch.randn(4, 6)
XN = X.clone()
XN[1, 2] = float("nan")
XN[3, 0] = float("nan")
XI = torch.randint(0, 3, (4, 6))


# ---------------------------------------------------------------- sort / select
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("desc", [False, True])
def test_sort(dim, desc):
    check(lambda t: torch.sort(t, dim=dim, descending=desc), XN)
    check(lambda t: torch.sort(t, stable=True, dim=dim, descending=desc), XI)  # ties keep order
    check(lambda t: torch.sort(t, dim=dim, descending=desc)[0], X, grad=(0,))


def test_sort_dtypes_and_edge():
    check(lambda t: torch.sort(t, stable=True), torch.tensor([True, False, True, False]))
    check(lambda t: torch.sort(t, stable=True, descending=True), torch.randint(-100, 100, (50,), dtype=torch.int32))
    check(lambda t: torch.sort(t), torch.tensor(3.0))
    check(lambda t: torch.sort(t, 0), torch.empty(0, 3))
    check(lambda t: torch.argsort(t, stable=True, dim=1), XI)
    check(lambda t: torch.msort(t), X)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    check(lambda t: torch.topk(t, 3, 1, largest=largest), X, grad=(0,))
    check(lambda t: torch.topk(t, 2, 0, largest=largest), X, grad=(0,))


def test_kthvalue_median_mode():
    check(lambda t: torch.kthvalue(t, 2, 1), X, grad=(0,))
    check(lambda t: torch.kthvalue(t, 3, 0, keepdim=True), X)
    check(lambda t: torch.median(t), XN)
    check(lambda t: torch.median(t), torch.randn(7), grad=(0,))
    check(lambda t: torch.median(t, 1), XN)
    check(lambda t: torch.median(t, 1), X, grad=(0,))
    check(lambda t: torch.median(t, 0, keepdim=True), XI)
    check(lambda t: torch.nanmedian(t), XN)
    check(lambda t: torch.nanmedian(t, 1), XN)
    check(lambda t: torch.mode(t, 1), XI)
    check(lambda t: torch.mode(t, 0), XI.float())


def test_cummax_cummin():
    for f in (torch.cummax, torch.cummin):
        check(lambda t: f(t, 1), XN)
        check(lambda t: f(t, 0), XI)
        check(lambda t: f(t, 1), X, grad=(0,))


def test_searchsorted_bucketize():
    s = torch.sort(torch.randn(10)).values
    v = torch.randn(3, 4)
    check(lambda a, b: torch.searchsorted(a, b), s, v)
    seq, val = torch.tensor([1., 2, 2, 3]), torch.tensor([2., 0, 5])
    check(lambda a, b: torch.searchsorted(a, b, right=True, out_int32=True), seq, val)
    check(lambda a, b: torch.searchsorted(a, b, side="right"), seq, val)
    check(lambda a, b: torch.searchsorted(a, b), torch.sort(torch.randn(3, 5)).values, v)
    un = torch.tensor([3., 1, 2, 5, 4, 0])
    check(lambda a, b, c: torch.searchsorted(a, b, sorter=c), un, torch.tensor([2.5, 0.5]), torch.argsort(un))
    check(lambda a: torch.searchsorted(a, 0.3), s)
    check(lambda a, b: torch.bucketize(a, b), v, s)
    check(lambda a, b: torch.bucketize(a, b, right=True), torch.tensor([1, 2, 3]), torch.tensor([1, 2, 2, 3]))


def test_searchsorted_empty_sequence_with_sorter():
    # OpInfo sample: T[0] sequence with a T[0] sorter (the sorter gather has nothing to index).
    e, ei = torch.empty(0), torch.empty(0, dtype=torch.long)
    check(lambda a, b, c: torch.searchsorted(a, b, sorter=c), e, e, ei)
    check(lambda a, b, c: torch.searchsorted(a, b, sorter=c, right=True), e, torch.randn(3), ei)
    check(lambda a, b, c: torch.searchsorted(a, b, sorter=c, out_int32=True), torch.empty(2, 0),
          torch.randn(2, 3), torch.empty(2, 0, dtype=torch.long))


# ---------------------------------------------------------------- data-dependent shapes
def test_nonzero_masked_select_no_fallback():
    m = X > 0
    check(lambda t: torch.nonzero(t), XI)
    check(lambda t: torch.nonzero(t, as_tuple=True), XI)
    check(lambda t: torch.nonzero(t), torch.zeros(3, 2))
    check(lambda t: torch.nonzero_static(t, size=30, fill_value=-7), XI)
    check(lambda t: torch.argwhere(t), XI)
    check(lambda t, mm: torch.masked_select(t, mm), X, m, grad=(0,))
    check(lambda t, mm: torch.masked_select(t, mm), X, m[0])  # broadcast mask


def test_boolean_mask_indexing():
    m = X > 0
    check(lambda t, mm: t[mm], X, m, grad=(0,))
    check(lambda t, mm: t[:, mm[0]], X, m, grad=(0,))

    def put(t, mm):
        t = t.clone()
        t[mm] = torch.arange(int(mm.sum()), dtype=t.dtype, device=t.device)
        return t
    check(put, X, m)


def test_unique_variants():
    check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), XI)
    check(lambda t: torch.unique(t), torch.tensor([3., 1, 2, 1, 3, 0.5]))
    check(lambda t: torch.unique(t, return_inverse=True), torch.empty(0))
    check(lambda t: torch.unique(t, dim=0, return_inverse=True, return_counts=True), torch.randint(0, 2, (8, 3)))
    check(lambda t: torch.unique(t, dim=1, return_inverse=True, return_counts=True), torch.randint(0, 2, (3, 8)))
    check(lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True),
          torch.tensor([1, 1, 2, 2, 3, 1, 1, 2]))
    check(lambda t: torch.unique_consecutive(t, dim=0, return_inverse=True, return_counts=True),
          torch.tensor([[1, 2], [1, 2], [3, 4], [1, 2]]))


def test_repeat_interleave():
    check(lambda t, r: torch.repeat_interleave(t, r, dim=0), X, torch.tensor([1, 0, 3, 2]), grad=(0,))
    check(lambda r: torch.repeat_interleave(r), torch.tensor([1, 0, 3, 2]))
    check(lambda t: torch.repeat_interleave(t, 2, dim=1), X, grad=(0,))


# ---------------------------------------------------------------- indexing extras
def test_take_put_index_fill_copy():
    check(lambda t, i: torch.take(t, i), X, torch.tensor([[0, 5], [-1, 7]]), grad=(0,))
    check(lambda t, i: torch.take_along_dim(t, i, 1), X, torch.randint(0, 6, (4, 3)), grad=(0,))
    check(lambda t, i, s: t.clone().put_(i, s), X, torch.tensor([0, 5, -1]), torch.tensor([1., 2, 3]))
    check(lambda t, i, s: t.clone().put_(i, s, accumulate=True), X, torch.tensor([0, 5, 0]), torch.tensor([1., 2, 3]))
    check(lambda t, i: t.index_fill(1, i, -2.), X, torch.tensor([0, -1]), grad=(0,))
    check(lambda t, i: t.index_fill(0, i, torch.tensor(5., device=t.device)), X, torch.tensor([2]))
    check(lambda t, i, s: t.index_copy(1, i, s), X, torch.tensor([3, 0]), torch.randn(4, 2), grad=(0, 2))


def test_one_window_writes():
    # one-row / one-point scatters get a second window that changes nothing
    # (XLA copies the whole operand for a single-window scatter): values, -0.0
    # signs, negative indices and every reduction as on CPU
    kv = torch.randn(64, 2, 3)
    one, row = torch.tensor([7]), torch.randn(1, 2, 3)
    check(lambda t, i, s: t.clone().index_copy_(0, i, s), kv, one, row)
    check(lambda t, i, s: t.clone().index_add_(0, i, s), kv, one, row)
    z = torch.zeros(4, 2)
    z[1] = -0.0
    got = z.to(DEV).index_add_(0, torch.tensor([1], device=DEV), torch.full((1, 2), -0.0, device=DEV)).cpu()
    assert torch.equal(got.signbit(), z.clone().index_add_(0, torch.tensor([1]), torch.full((1, 2), -0.0)).signbit())
    check(lambda t, i, s: t.clone().index_add_(0, i, s, alpha=3), XI, torch.tensor([2]), torch.randint(0, 5, (1, 6)))
    check(lambda t, i: t.clone().index_fill_(0, i, 3.0), kv, one)
    check(lambda t, i, s: t.clone().put_(i, s), X, torch.tensor([5]), torch.tensor([9.]))
    check(lambda t, i, s: t.clone().put_(i, s, accumulate=True), X, torch.tensor([-1]), torch.tensor([9.]))
    for acc in (False, True):
        check(lambda t, i, s: t.clone().index_put_((i,), s, accumulate=acc), kv, one, row)
        check(lambda t, i, j, s: t.clone().index_put_((i, j), s, accumulate=acc), kv, one, torch.tensor([1]),
              torch.randn(1, 3))
        check(lambda t, i, s: t.clone().index_put_((i,), s, accumulate=acc), X, torch.tensor(2), torch.randn(6))
    for red in ("sum", "prod", "amax", "amin", "mean"):
        check(lambda t, i, s: t.clone().scatter_reduce_(0, i, s, red), X, torch.tensor([[3]]), torch.tensor([[4.]]))
    check(lambda t, i, s: t.clone().scatter_(0, i, s), X, torch.tensor([[3]]), torch.tensor([[4.]]))
    check(lambda t, i, s: t.clone().scatter_add_(0, i, s), X, torch.tensor([[3]]), torch.tensor([[4.]]))
    b = torch.zeros(5, dtype=torch.bool)
    check(lambda t, i: t.clone().index_fill_(0, i, True), b, torch.tensor([4]))


def test_masked_scatter():
    m = X > 0
    check(lambda t, mm, s: t.masked_scatter(mm, s), X, m, torch.randn(30), grad=(0, 2))
    check(lambda t, mm, s: t.masked_scatter(mm, s), X, m[0], torch.randn(30))


@pytest.mark.parametrize("red", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(red, include_self):
    idx = torch.randint(0, 6, (4, 3))
    g = (0, 2) if red in ("sum", "mean", "amax", "amin") else ()
    check(lambda t, i, s: t.scatter_reduce(1, i, s, red, include_self=include_self), X, idx, torch.randn(4, 3), grad=g)
    if red != "mean":
        check(lambda t, i, s: t.scatter_reduce(0, i, s, red, include_self=include_self),
              torch.randint(-5, 5, (5,)), torch.tensor([0, 0, 2]), torch.tensor([-9, -8, 3]))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    w = torch.randn(10, 3)
    idx, off = torch.tensor([1, 2, 0, 3, 2, 5, 9]), torch.tensor([0, 2, 2, 5])
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, idx, off, grad=(0,))
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=2), w, idx, off, grad=(0,))
    check(lambda w, i: F.embedding_bag(i, w, mode=mode), w, torch.randint(0, 10, (3, 4)), grad=(0,))
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, include_last_offset=True), w, idx,
          torch.tensor([0, 2, 2, 5, 7]), grad=(0,))
    if mode == "sum":
        check(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p), w, idx, off,
              torch.rand(7), grad=(0, 3))


# ---------------------------------------------------------------- shape / creation
def test_shape_extras():
    check(lambda t: t.unfold(1, 3, 2), X, grad=(0,))
    check(lambda t: t.unfold(0, 2, 3), torch.randn(7), grad=(0,))
    check(lambda t: torch.diag(t, 1), X, grad=(0,))
    check(lambda t: torch.diag(t), torch.randn(4), grad=(0,))
    check(lambda t: torch.diag_embed(t), X, grad=(0,))
    check(lambda t: torch.diagonal(t, -1), X, grad=(0,))
    check(lambda t: torch.narrow_copy(t, 1, 1, 3), X)
    check(lambda t, s: torch.select_scatter(t, s, 0, 1), X, torch.randn(6), grad=(0, 1))
    check(lambda t, s: torch.slice_scatter(t, s, 1, 0, 4, 2), X, torch.randn(4, 2), grad=(0, 1))
    check(lambda t, s: torch.diagonal_scatter(t, s, 1), X, torch.randn(4), grad=(0, 1))
    check(lambda t, s: torch.as_strided_scatter(t, s, (3,), (2,), 1), X, torch.randn(3), grad=(0, 1))
    check(lambda t: F.one_hot(t.flatten(), 4), XI)
    check(lambda a, b: torch.stack(torch.meshgrid(a, b, indexing="ij")), torch.randn(3), torch.randn(2))
    check(lambda t: (t.flip(0), t.roll(2, 1), t.tile(2, 1)), X)


def test_creation():
    fc = functools.partial(_check, equal_nan=False)  # fc(lambda dev: ...): no inputs
    fc(lambda d: torch.linspace(-1, 3, 7, device=d))
    fc(lambda d: torch.linspace(2, 3, 1, device=d))
    fc(lambda d: torch.linspace(0, 10, 4, device=d, dtype=torch.int64))
    fc(lambda d: torch.linspace(0, 1, 11, device=d, dtype=torch.float64))
    fc(lambda d: torch.logspace(0, 2, 5, device=d))
    fc(lambda d: torch.logspace(-1, 2, 4, base=2., device=d))
    fc(lambda d: torch.eye(3, device=d))
    fc(lambda d: torch.eye(3, 5, device=d, dtype=torch.int32))
    fc(lambda d: torch.tril_indices(4, 5, device=d))
    fc(lambda d: torch.tril_indices(4, 3, -1, device=d))
    fc(lambda d: torch.triu_indices(4, 5, 1, device=d))
    fc(lambda d: torch.zeros(2, 3, device=d))
    fc(lambda d: torch.ones(2, 3, device=d, dtype=torch.int8))
    fc(lambda d: torch.full((2, 3), 1.5, device=d))
    fc(lambda d: torch.zeros_like(torch.empty(2, 2, device=d)))


def test_errors_match_cpu():
    for d in ("cpu", DEV):
        with pytest.raises(RuntimeError):
            torch.topk(torch.randn(3, device=d), 5)
        with pytest.raises(RuntimeError):
            torch.masked_select(torch.randn(3, device=d), torch.ones(3, device=d))  # non-bool mask
        with pytest.raises(RuntimeError):
            torch.repeat_interleave(torch.tensor([1, -1], device=d))
