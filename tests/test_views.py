"""Views, in-place ops and aliasing on tpu, compared with CPU PyTorch
(values AND sizes/strides/storage_offset, and what every alias sees)."""
import gc

import pytest
import torch

DEV = "tpu"


def meta(t):
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def same(tpu, cpu):
    """Values and view metadata of a tpu tensor equal those of a CPU tensor."""
    assert tpu.device.type == "tpu"
    assert meta(tpu) == meta(cpu), (meta(tpu), meta(cpu))
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0, equal_nan=True)


def flat(x):
    return x if isinstance(x, (list, tuple)) else [x]


def base(*shape, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    c = (torch.arange(n, dtype=torch.float64) * 1.5 - 7).to(dtype).reshape(shape)
    return c, c.to(DEV)


def check_view(fn, *shape, dtype=torch.float32, shares=True):
    c, t = base(*shape, dtype=dtype)
    rc, rt = fn(c), fn(t)
    for a, b in zip(flat(rt), flat(rc), strict=True):
        same(a, b)
        if shares:
            assert a.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
    return c, t, rc, rt


VIEWS = {
    "view": (lambda x: x.view(4, 6), (2, 3, 4)),
    "view_flat": (lambda x: x.view(-1), (2, 3, 4)),
    "reshape_view": (lambda x: x.reshape(6, 4), (2, 3, 4)),
    "as_strided": (lambda x: x.as_strided((3, 2), (4, 3), 1), (24,)),
    "as_strided_overlap": (lambda x: x.as_strided((4, 3), (1, 1), 2), (24,)),
    "transpose": (lambda x: x.transpose(0, 2), (2, 3, 4)),
    "t": (lambda x: x.t(), (3, 5)),
    "permute": (lambda x: x.permute(2, 0, 1), (2, 3, 4)),
    "slice": (lambda x: x[1:, ::2], (4, 6)),
    "slice_step3": (lambda x: x[:, 1::3, 2:], (2, 7, 5)),
    "select": (lambda x: x[:, 2], (3, 4, 5)),
    "select_neg": (lambda x: x.select(0, -1), (3, 4)),
    "narrow": (lambda x: x.narrow(1, 1, 2), (3, 4)),
    "expand": (lambda x: x[:, None, :].expand(3, 4, 5), (3, 5)),
    "squeeze": (lambda x: x.squeeze(), (3, 1, 4, 1)),
    "squeeze_dim": (lambda x: x.squeeze(1), (3, 1, 4)),
    "unsqueeze": (lambda x: x.unsqueeze(1), (3, 4)),
    "diagonal": (lambda x: x.diagonal(), (4, 4)),
    "diagonal_off": (lambda x: x.diagonal(1, 0, 2), (3, 2, 5)),
    "unfold": (lambda x: x.unfold(0, 3, 2), (9, 2)),
    "unfold_overlap": (lambda x: x.unfold(1, 4, 1), (2, 8)),
    "split": (lambda x: x.split(2, 1), (3, 5)),
    "chunk": (lambda x: x.chunk(3, 0), (7, 2)),
    "unbind": (lambda x: x.unbind(1), (3, 4)),
    "t_of_slice": (lambda x: x[1:3].t()[::2], (4, 5)),
    "movedim": (lambda x: x.movedim(0, -1), (2, 3, 4)),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view_metadata_and_values(name):
    fn, shape = VIEWS[name]
    check_view(fn, *shape)


def test_reshape_copy_when_needed():
    c, t = base(3, 4)
    rc, rt = c.t().reshape(12), t.t().reshape(12)
    same(rt, rc)
    assert rt.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


@pytest.mark.parametrize("src,dst", [
    (torch.float32, torch.int32), (torch.float32, torch.uint8), (torch.float32, torch.bfloat16),
    (torch.int64, torch.float64), (torch.int16, torch.float16), (torch.uint8, torch.float32),
    (torch.float64, torch.int16), (torch.int8, torch.uint8),
])
def test_view_dtype(src, dst):
    c = (torch.arange(48, dtype=torch.float64) * 3.25 - 40).to(src).reshape(4, 12)
    t = c.to(DEV)
    same(t.view(dst), c.view(dst))
    # views of a non-trivial view, then read back through the original
    same(t[1:3].view(dst), c[1:3].view(dst))


def test_view_dtype_write_through():
    c = torch.linspace(-3, 5, 16).reshape(4, 4)
    t = c.to(DEV)
    c.view(torch.int32)[1].fill_(0x3F800000)  # 1.0f bit pattern
    t.view(torch.int32)[1].fill_(0x3F800000)
    same(t, c)
    c.view(torch.int16)[:, 1::2].zero_()
    t.view(torch.int16)[:, 1::2].zero_()
    same(t, c)
    same(t.view(torch.uint8), c.view(torch.uint8))


def test_inplace_view_ops():
    c, t = base(3, 4)
    for op in (lambda x: x.t_(), lambda x: x.transpose_(0, 1), lambda x: x.unsqueeze_(1),
               lambda x: x.squeeze_(1), lambda x: x.unsqueeze_(0), lambda x: x.squeeze_()):
        rc, rt = op(c), op(t)
        assert rt is t and rc is c
        same(t, c)


# ---------------------------------------------------------------- in-place through views
SLICERS = {
    "transposed": lambda x: x.t(),
    "slice_rows": lambda x: x[1:4],
    "slice_cols_step": lambda x: x[:, ::2],
    "strided_2d": lambda x: x[1::2, 1::3],
    "select_col": lambda x: x[:, 3],
    "diagonal": lambda x: x.diagonal(),
    "as_strided": lambda x: x.as_strided((2, 3), (7, 2), 3),
    "flat_view": lambda x: x.view(-1)[5:17],
    "permuted3d": lambda x: x.view(2, 3, 6).permute(2, 0, 1)[1:5],
}

INPLACE = {
    "add_": lambda v: v.add_(2.5),
    "add_tensor": lambda v: v.add_(torch.ones_like(v) * 3, alpha=2),
    "mul_": lambda v: v.mul_(-2),
    "sub_": lambda v: v.sub_(0.25),
    "div_": lambda v: v.div_(4),
    "fill_": lambda v: v.fill_(7),
    "zero_": lambda v: v.zero_(),
    "clamp_": lambda v: v.clamp_(-3, 4),
    "relu_": lambda v: v.relu_(),
    "copy_": lambda v: v.copy_(torch.full_like(v, 9.0).mul(torch.ones_like(v))),
}


@pytest.mark.parametrize("sname", list(SLICERS))
@pytest.mark.parametrize("oname", list(INPLACE))
def test_inplace_through_view(sname, oname):
    c, t = base(6, 6)
    aliases = [lambda x: x, lambda x: x.view(-1), lambda x: x.t(), lambda x: x[2:, 1:]]
    other_c = [a(c) for a in aliases]
    other_t = [a(t) for a in aliases]
    vc, vt = SLICERS[sname](c), SLICERS[sname](t)
    rc, rt = INPLACE[oname](vc), INPLACE[oname](vt)
    assert rt is vt
    same(vt, vc)
    same(t, c)
    for a, b in zip(other_t, other_c):
        same(a, b)
    # a view taken after the write sees it too
    same(SLICERS[sname](t), SLICERS[sname](c))


def test_copy_from_transposed_and_overlapping_source():
    c, t = base(4, 4)
    dc, dt = torch.zeros(4, 4), torch.zeros(4, 4, device=DEV)
    dc.copy_(c.t())
    dt.copy_(t.t())
    same(dt, dc)
    # overlapping (expanded) source
    dc[1:3].copy_(c[0].expand(2, 4))
    dt[1:3].copy_(t[0].expand(2, 4))
    same(dt, dc)
    # overlapping window source read
    same(t.view(-1).as_strided((5, 4), (2, 1)), c.view(-1).as_strided((5, 4), (2, 1)))


OVERLAP_ERR = "refers? to a single memory location"


def test_overlapping_writes_error_like_cpu():
    for x in (base(10)[0], base(10)[1]):
        with pytest.raises(RuntimeError, match=OVERLAP_ERR):
            x[2:8].copy_(x[0:6])  # partial overlap of source and destination
        with pytest.raises(RuntimeError, match=OVERLAP_ERR):
            torch.add(x[:-1], 1, out=x[1:])
        with pytest.raises(RuntimeError, match=OVERLAP_ERR):
            x[:2].expand(3, 2).add_(1)  # written-to elements alias each other
        with pytest.raises(RuntimeError, match=OVERLAP_ERR):
            x.view(2, 5)[:, :1].expand(2, 3).copy_(torch.zeros(2, 3))
    for x in (base(4, 4)[0], base(4, 4)[1]):
        with pytest.raises(RuntimeError, match=OVERLAP_ERR):
            x.copy_(x.t())
    # allowed on CPU: full overlap, and fill_/zero_ of expanded views
    c, t = base(10)
    for x in (c, t):
        torch.add(x, 1, out=x)
        x.mul_(x)
        x[:1].expand(4).zero_()
        x.unfold(0, 4, 2).fill_(3)
        x[5:].copy_(x[5:])
    same(t, c)
    c, t = base(3, 4)
    c[1:].copy_(c[:-1].clone())
    t[1:].copy_(t[:-1].clone())
    same(t, c)


def test_reads_of_overlapping_views_after_writes():
    c, t = base(12)
    wc = c.unfold(0, 4, 2)
    wt = t.unfold(0, 4, 2)
    c[3] = 100.0
    t[3] = 100.0
    same(wt, wc)
    same(wt + 1, wc + 1)
    same(torch.mul(wt, wt), torch.mul(wc, wc))
    ec, et = c[:3].expand(2, 3), t[:3].expand(2, 3)
    same(et * 2, ec * 2)


def test_binary_ops_on_noncontiguous_inputs():
    c, t = base(5, 6)
    same(t.t()[1:] + t[::2].t()[1:, :1], c.t()[1:] + c[::2].t()[1:, :1])
    same(torch.where(t.t() > 0, t.t(), -t.t()), torch.where(c.t() > 0, c.t(), -c.t()))
    same(torch.mm(t.t()[:, :4], t[:4, 1:3]), torch.mm(c.t()[:, :4], c[:4, 1:3]))
    same(torch.clamp(t[:, 1::2], -2, 3), torch.clamp(c[:, 1::2], -2, 3))


# ---------------------------------------------------------------- out=
def test_out_noncontiguous():
    c, t = base(4, 6)
    oc, ot = torch.zeros(4, 6), torch.zeros(4, 6, device=DEV)
    torch.add(c.t(), 1, out=oc.t())
    torch.add(t.t(), 1, out=ot.t())
    same(ot, oc)
    oc2, ot2 = torch.zeros(4, 12), torch.zeros(4, 12, device=DEV)
    torch.mul(c, 3, out=oc2[:, ::2])
    torch.mul(t, 3, out=ot2[:, ::2])
    same(ot2, oc2)
    torch.mm(c[:, :4], c[:4, :4], out=oc2[:, 1:9:2])
    torch.mm(t[:, :4], t[:4, :4], out=ot2[:, 1:9:2])
    same(ot2, oc2)


def test_out_needs_resize():
    c, t = base(3, 4)
    oc, ot = torch.empty(0), torch.empty(0, device=DEV)
    torch.add(c, c, out=oc)
    torch.add(t, t, out=ot)
    same(ot, oc)
    oc, ot = torch.zeros(2), torch.zeros(2, device=DEV)
    with pytest.warns(UserWarning):
        torch.sub(c, 1, out=oc)
    with pytest.warns(UserWarning):
        torch.sub(t, 1, out=ot)
    same(ot, oc)
    bc, bt = torch.empty(0, dtype=torch.bool), torch.empty(0, dtype=torch.bool, device=DEV)
    torch.gt(c, 0, out=bc)
    torch.gt(t, 0, out=bt)
    same(bt, bc)


def test_out_wrong_dtype_errors_like_cpu():
    c, t = base(3)
    with pytest.raises(RuntimeError):
        torch.add(c, c, out=torch.empty(3, dtype=torch.int64))
    with pytest.raises(RuntimeError):
        torch.add(t, t, out=torch.empty(3, dtype=torch.int64, device=DEV))


# ---------------------------------------------------------------- set_ / resize_
def test_set_storage_and_tensor():
    c, t = base(4, 5)
    xc, xt = torch.empty(0), torch.empty(0, device=DEV)
    xc.set_(c.untyped_storage(), 2, (3, 2), (4, 1))
    xt.set_(t.untyped_storage(), 2, (3, 2), (4, 1))
    same(xt, xc)
    xt.fill_(-1)
    xc.fill_(-1)
    same(t, c)  # set_ aliases the storage
    yc, yt = torch.empty(0), torch.empty(0, device=DEV)
    yc.set_(c)
    yt.set_(t)
    same(yt, yc)
    zc, zt = torch.empty(0), torch.empty(0, device=DEV)
    zc.set_(c.untyped_storage())
    zt.set_(t.untyped_storage())
    same(zt, zc)
    zt.set_()
    zc.set_()
    same(zt, zc)


def test_set_rejects_cpu_storage():
    with pytest.raises(RuntimeError):
        torch.empty(0, device=DEV).set_(torch.zeros(3).untyped_storage())


def test_resize_grow_shrink_keeps_data():
    c, t = base(2, 3)
    c.resize_(3, 4)
    t.resize_(3, 4)
    assert meta(t) == meta(c)
    # first 6 elements are preserved; the rest is uninitialized on CPU
    same(t.view(-1)[:6], c.view(-1)[:6])
    c.resize_(2, 2)
    t.resize_(2, 2)
    same(t, c)
    c.resize_(0)
    t.resize_(0)
    same(t, c)


def test_resize_memory_format():
    c, t = base(2, 3, 4, 5)
    c.resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    t.resize_(2, 3, 4, 5, memory_format=torch.channels_last)
    assert meta(t) == meta(c)


def test_untyped_storage_resize():
    t = torch.ones(4, device=DEV)
    s = t.untyped_storage()
    before = torch.tpu.memory_allocated()
    s.resize_(64)
    assert s.nbytes() == 64
    assert torch.tpu.memory_allocated() - before == 48
    s.resize_(8)
    assert s.nbytes() == 8
    x = torch.empty(0, device=DEV).set_(s, 0, (2,), (1,))
    same(x, torch.ones(2))


# ---------------------------------------------------------------- version counters
def test_version_counters_match_cpu():
    def script(x):
        v = []
        y = x[1:]
        v.append((x._version, y._version))
        y.add_(1)
        v.append((x._version, y._version))
        x.mul_(2)
        v.append((x._version, y._version))
        x.t_()
        v.append(x._version)
        torch.add(x, 1, out=x)
        v.append(x._version)
        x.zero_()
        x.fill_(3)
        x.copy_(x + 1)
        v.append(x._version)
        x.resize_(2, 2)
        v.append(x._version)
        z = x.view(-1)
        z[0] = 5
        v.append((x._version, z._version))
        return v

    c, t = base(3, 3)
    assert script(t) == script(c)


# ---------------------------------------------------------------- fresh memory
def test_empty_never_exposes_old_data():
    for n in (1, 7, 1024, 1 << 16):
        for _ in range(3):
            x = torch.full((n,), 123.0, device=DEV)
            x.cpu()
            del x
            gc.collect()
            y = torch.empty(n, device=DEV)
            assert not (y.cpu() == 123.0).any()
            del y
    # reusing a freed storage through a different dtype/shape
    a = torch.full((64, 64), -5.0, device=DEV, dtype=torch.float64)
    del a
    b = torch.empty(128, 64, device=DEV, dtype=torch.float32)
    assert not (b.cpu() == -5.0).any()
    e = torch.empty_strided((4, 4), (1, 8), device=DEV)
    assert not (e.cpu() == -5.0).any()


def test_empty_like_and_new_empty_are_fresh():
    x = torch.full((3, 5), 42.0, device=DEV)
    assert not (torch.empty_like(x).cpu() == 42.0).any()
    assert not (x.new_empty((5, 3)).cpu() == 42.0).any()


def test_clone_is_independent():
    c, t = base(3, 4)
    kt, kc = t.t().clone(), c.t().clone()
    same(kt, kc)
    t.fill_(0)
    c.fill_(0)
    same(kt, kc)
    kt2 = t.clone(memory_format=torch.contiguous_format)
    assert kt2.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_contiguous_of_views():
    c, t = base(4, 5, 3)
    for f in (lambda x: x.permute(2, 0, 1), lambda x: x[:, ::2], lambda x: x.transpose(1, 2)[1:]):
        rt, rc = f(t).contiguous(), f(c).contiguous()
        same(rt, rc)
        assert rt.is_contiguous()
    assert t.contiguous() is t


@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_aliasing_in_other_modes(mode):
    import torchtpu

    with torchtpu.mode(mode):
        for sname in ("transposed", "strided_2d", "diagonal", "permuted3d"):
            for oname in ("add_", "fill_", "copy_", "mul_"):
                test_inplace_through_view(sname, oname)
        test_version_counters_match_cpu()
        test_view_dtype_write_through()
        c, t = base(4, 4)
        # a chain of writes and reads recorded into one region
        for x in (c, t):
            x.t()[1:].add_(1)
            x.view(-1)[::3].mul_(2)
            y = x[1:3] + x[2:4]
            x[0].copy_(y[0])
        same(t, c)


@pytest.mark.parametrize("op", ["add_", "sub_", "mul_", "div_", "atan2_", "pow_", "copysign_", "fmod_", "hypot_"])
def test_inplace_op_with_self_as_other_argument(op):
    # x.sub_(x) passes one tensor twice; the result must land in x
    # (transformers' Trainer resets its loss with `tr_loss -= tr_loss`).
    c = torch.tensor([[4.0, -5.0], [0.5, 3.0]])
    x = c.to("tpu")
    r = getattr(x, op)(x)
    getattr(c, op)(c)
    assert r is x
    torch.testing.assert_close(x.cpu(), c, equal_nan=True)


def test_inplace_self_aliasing_multi_argument_and_foreach():
    c = torch.tensor([1.5, -2.0, 3.0])
    x = c.to("tpu")
    x.addcmul_(x, x, value=0.5)
    c.addcmul_(c, c, value=0.5)
    torch.testing.assert_close(x.cpu(), c)
    xs, cs = [c.to("tpu"), (c * 2).to("tpu")], [c.clone(), c * 2]
    torch._foreach_sub_(xs, xs)
    torch._foreach_sub_(cs, cs)
    for a, b in zip(xs, cs):
        torch.testing.assert_close(a.cpu(), b)
    tr = torch.tensor(0.0, device="tpu")
    for step in range(3):
        tr += torch.tensor(4.0, device="tpu")
        assert tr.item() == 4.0
        tr -= tr
        assert tr.item() == 0.0


def test_torch_equal_native_like_cpu():
    import torchtpu
    torchtpu.reset_metrics()
    a = torch.tensor([1.0, 2.0, float("nan")])
    t = a.to("tpu")
    for x, y in [(a, a), (a[:2], a[:2].clone()), (a, a[:2]), (a[:2], a[:2].double()),
                 (torch.tensor([1.0, 2.5]), torch.tensor([1, 2])), (torch.zeros(0), torch.zeros(0)),
                 (torch.ones(2, 3), torch.ones(3, 2))]:
        assert torch.equal(x.to("tpu"), y.to("tpu")) == torch.equal(x, y), (x, y)
    with pytest.raises(RuntimeError, match="different devices"):
        torch.equal(t, a)
    assert torchtpu.metrics()["cpu_fallbacks"] == {}
