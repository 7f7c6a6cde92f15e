"""Sparse COO tensors on tpu (issue 39, item 5), each against CPU PyTorch:
construction, conversion, coalesce, sparse x dense products and their
gradients, reductions, elementwise ops, and the recommendation-model uses
(Embedding/EmbeddingBag with sparse gradients, SGD and SparseAdam)."""
import pytest
import torch

import torchtpu  # noqa: F401

D = "tpu"


def _same(got, want):
    assert got.device.type == D
    assert got.is_sparse == want.is_sparse
    if want.is_sparse:
        assert got.sparse_dim() == want.sparse_dim() and got.dense_dim() == want.dense_dim()
        got, want = got.cpu().to_dense(), want.to_dense()
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want)


@pytest.fixture
def coo():
    torch.manual_seed(0)
    # duplicate (1, 2) and (0, 2) entries: uncoalesced, as a user builds one
    i = torch.tensor([[0, 1, 1, 3, 0, 1], [2, 0, 2, 1, 2, 2]])
    v = torch.randn(6)
    return torch.sparse_coo_tensor(i, v, (4, 3))


def test_construct_and_convert(coo):
    i, v = coo._indices(), coo._values()
    a = torch.sparse_coo_tensor(i.to(D), v.to(D), (4, 3))
    b = torch.sparse_coo_tensor(i, v, (4, 3), device=D)
    c = coo.to(D)
    for t in (a, b, c):
        assert t.is_sparse and t.layout == torch.sparse_coo and t.device.type == D
        assert t._nnz() == 6 and not t.is_coalesced()
        _same(t, coo)
        _same(t.to_dense(), coo.to_dense())
    assert c.cpu().is_sparse
    _same(torch.sparse_coo_tensor(i.to(D), v.to(D)), torch.sparse_coo_tensor(i, v))  # inferred size


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_coalesce_matches_cpu(coo, dtype):
    s = coo.to(dtype) if dtype.is_floating_point else (coo * 10).to(dtype)
    want = s.coalesce()
    got = s.to(D).coalesce()
    assert got.is_coalesced() and got._nnz() == want._nnz()
    assert torch.equal(got.indices().cpu(), want.indices())
    torch.testing.assert_close(got.values().cpu(), want.values())


def test_dense_to_sparse_and_hybrid():
    torch.manual_seed(1)
    x = torch.randn(5, 4, 3)
    x[1] = 0
    x[:, 2] = 0
    for sparse_dim in (1, 2, 3):
        want = x.to_sparse(sparse_dim)
        got = x.to(D).to_sparse(sparse_dim)
        assert torch.equal(got.indices().cpu(), want.indices())
        _same(got, want)
    hybrid = torch.sparse_coo_tensor(torch.tensor([[0, 2, 0], [1, 1, 1]]), torch.randn(3, 2), (3, 2, 2))
    _same(hybrid.to(D).coalesce(), hybrid.coalesce())


@pytest.mark.parametrize("coalesced", [False, True])
def test_sparse_dense_matmul(coo, coalesced):
    s = coo.coalesce() if coalesced else coo
    m, b = torch.randn(3, 5), torch.randn(4, 5)
    st, mt, bt = s.to(D), m.to(D), b.to(D)
    _same(torch.sparse.mm(st, mt), torch.sparse.mm(s, m))
    _same(st @ mt, s @ m)
    _same(torch.mm(st, mt), torch.mm(s, m))
    _same(torch.addmm(bt, st, mt, beta=0.5, alpha=2.0), torch.addmm(b, s, m, beta=0.5, alpha=2.0))
    _same(torch.sparse.addmm(bt, st, mt), torch.sparse.addmm(b, s, m))
    out = bt.clone()
    out.addmm_(st, mt, alpha=-1.0)
    _same(out, b.clone().addmm_(s, m, alpha=-1.0))


def test_matmul_gradients(coo):
    m = torch.randn(3, 5)
    # dense operand
    mc, mt = m.clone().requires_grad_(), m.to(D).requires_grad_()
    (torch.sparse.mm(coo, mc) ** 2).sum().backward()
    (torch.sparse.mm(coo.to(D), mt) ** 2).sum().backward()
    _same(mt.grad, mc.grad)
    # sparse operand: a sparse gradient on the operand's pattern (sparse_mask)
    sc = coo.coalesce().requires_grad_()
    st = coo.to(D).coalesce().requires_grad_()
    (torch.sparse.mm(sc, m) ** 2).sum().backward()
    (torch.sparse.mm(st, m.to(D)) ** 2).sum().backward()
    assert st.grad.is_sparse
    _same(st.grad, sc.grad)


def test_reductions(coo):
    st = coo.to(D)
    _same(torch.sparse.sum(st), torch.sparse.sum(coo))
    _same(st.sum(), coo.sum())
    for dim in (0, 1, (0, 1)):
        _same(torch.sparse.sum(st, dim=dim), torch.sparse.sum(coo, dim=dim))


def test_elementwise(coo):
    st = coo.to(D)
    dense = torch.randn(4, 3)
    _same(st + st, coo + coo)
    _same(st - st * 2, coo - coo * 2)
    _same(dense.to(D) + st, dense + coo)
    _same(torch.add(dense.to(D), st, alpha=3), torch.add(dense, coo, alpha=3))
    _same(st * 3, coo * 3)
    _same(st * st, coo * coo)
    _same(st.coalesce() * dense.to(D), coo.coalesce() * dense)
    _same(st / 2, coo / 2)
    _same(-st, -coo)
    _same(st.t(), coo.t())
    _same(st.unsqueeze(0), coo.unsqueeze(0))
    _same(dense.to(D).sparse_mask(st.coalesce()), dense.sparse_mask(coo.coalesce()))
    z = st.clone()
    z.zero_()
    assert z._nnz() == 0 and z.to_dense().abs().sum().item() == 0


def test_device_rules_and_errors(coo):
    with pytest.raises(RuntimeError, match="same device"):
        torch.sparse.mm(coo, torch.randn(3, 2, device=D))
    with pytest.raises(RuntimeError, match="same device"):
        torch.sparse.mm(coo.to(D), torch.randn(3, 2))
    with pytest.raises(RuntimeError, match="backend of indices"):
        torch.sparse_coo_tensor(coo._indices().to(D), coo._values(), (4, 3))
    with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
        torch.sparse_coo_tensor(torch.tensor([[0], [5]], device=D), torch.ones(1, device=D), (4, 3),
                                check_invariants=True)


def _pair(cls, *args, **kw):
    torch.manual_seed(0)
    ref = cls(*args, **kw)
    dev = cls(*args, **kw)
    dev.load_state_dict(ref.state_dict())
    return ref, dev.to(D)


@pytest.mark.parametrize("opt", ["SGD", "SparseAdam"])
def test_sparse_embedding_training(opt):
    ref, dev = _pair(torch.nn.Embedding, 20, 4, sparse=True)
    mk = {"SGD": lambda p: torch.optim.SGD(p, lr=0.1), "SparseAdam": lambda p: torch.optim.SparseAdam(p, lr=0.05)}[opt]
    o_ref, o_dev = mk(list(ref.parameters())), mk(list(dev.parameters()))
    for step in range(3):
        idx = torch.randint(0, 20, (4, 5))
        for model, o, ix in ((ref, o_ref, idx), (dev, o_dev, idx.to(D))):
            o.zero_grad()
            (model(ix) ** 2).sum().backward()
            assert model.weight.grad.is_sparse
            o.step()
        _same(dev.weight.grad, ref.weight.grad)
    torch.testing.assert_close(dev.weight.detach().cpu(), ref.weight.detach())


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_embedding_bag(mode, weighted):
    if weighted and mode != "sum":
        pytest.skip("per_sample_weights need mode='sum'")
    ref, dev = _pair(torch.nn.EmbeddingBag, 12, 4, mode=mode, sparse=True)
    idx = torch.tensor([1, 2, 4, 4, 3, 9, 11, 0])
    off = torch.tensor([0, 2, 2, 5])  # an empty bag
    w = torch.rand(8) if weighted else None
    out_ref = ref(idx, off, per_sample_weights=w)
    out_dev = dev(idx.to(D), off.to(D), per_sample_weights=None if w is None else w.to(D))
    _same(out_dev, out_ref.detach())
    (out_ref * torch.arange(4.0)[:, None]).sum().backward()
    (out_dev * torch.arange(4.0, device=D)[:, None]).sum().backward()
    assert dev.weight.grad.is_sparse
    _same(dev.weight.grad, ref.weight.grad)
    # the dense gradient path is unchanged
    ref_d, dev_d = _pair(torch.nn.EmbeddingBag, 12, 4, mode=mode)
    ref_d(idx, off).sum().backward()
    dev_d(idx.to(D), off.to(D)).sum().backward()
    assert not dev_d.weight.grad.is_sparse
    _same(dev_d.weight.grad, ref_d.weight.grad)


def test_recommendation_bag_as_sparse_matmul():
    """A bag-of-features layer written as sparse (batch x vocab) @ dense table,
    trained end to end: the table's gradient and the update match CPU."""
    torch.manual_seed(0)
    table = torch.randn(50, 8)
    rows = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    cols = torch.tensor([3, 7, 7, 1, 3, 49, 0])
    vals = torch.rand(7)
    bags = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (4, 50))
    tc, td = table.clone().requires_grad_(), table.to(D).requires_grad_()
    for t, b in ((tc, bags), (td, bags.to(D))):
        out = torch.sparse.mm(b, t)
        torch.nn.functional.mse_loss(out, torch.ones_like(out)).backward()
    _same(td.grad, tc.grad)
