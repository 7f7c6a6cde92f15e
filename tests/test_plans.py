"""Strict mode's op plans (csrc/core/aten/plan.h): a repeated op replays the first
call's program and binding. A replay must never be stale: every case here
compares against CPU PyTorch, and against the same run with plans off."""
import pytest
import torch

import torchtpu

DEV = "tpu"


@pytest.fixture(autouse=True)
def strict_with_plans():
    prev = torchtpu._C._set_op_plans(True)
    with torchtpu.mode("strict"):
        yield
    torchtpu._C._set_op_plans(prev)


def _counts():
    m = torchtpu.metrics()
    return m["plan_replays"], m["plans_recorded"], m["compiles"]


def test_replay_matches_cpu_and_skips_lowering(metrics):
    a, b = torch.randn(257), torch.randn(257)
    ta, tb = a.to(DEV), b.to(DEV)
    torch.add(ta, tb)  # records
    torchtpu.reset_metrics()
    for _ in range(5):
        out = torch.add(ta, tb)
    replays, recorded, compiles = _counts()
    assert (replays, recorded, compiles) == (5, 0, 0)
    assert torch.equal(out.cpu(), a + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int64])
def test_dtype_is_part_of_the_key(dtype):
    x = torch.arange(12).reshape(3, 4)
    for dt in (torch.float32, dtype, torch.float32, dtype):
        c = x.to(dt)
        t = c.to(DEV)
        got = t * t + t
        assert got.dtype == (c * c + c).dtype
        assert torch.equal(got.cpu(), c * c + c)


def test_shape_stride_and_offset_are_part_of_the_key():
    base = torch.randn(6, 6)
    tb = base.to(DEV)
    views = [
        (lambda x: x[:3, :3]),          # contiguous rows, offset 0
        (lambda x: x[2:5, 1:4]),        # same shape and strides, other offset
        (lambda x: x.t()[:3, :3]),      # same shape, transposed strides
        (lambda x: x[::2, ::2]),        # same shape, strided
        (lambda x: x[:3, :3]),          # the first again: a replay
    ]
    for _ in range(2):
        for v in views:
            assert torch.equal((v(tb) * 2 + 1).cpu(), v(base) * 2 + 1)
            r = v(tb).exp()
            assert r.stride() == v(base).exp().stride()
            torch.testing.assert_close(r.cpu(), v(base).exp())


def test_in_place_views_write_through():
    for _ in range(3):
        base = torch.zeros(4, 4)
        tb = base.to(DEV)
        for i in range(4):
            tb[i].add_(float(i + 1))  # same shape and strides, other offset each time
            base[i].add_(float(i + 1))
        tb.t()[1].mul_(3)
        base.t()[1].mul_(3)
        assert torch.equal(tb.cpu(), base)


def test_aliasing_is_part_of_the_key():
    x = torch.randn(8)
    for _ in range(2):
        a, b = x.clone().to(DEV), (x * 2).to(DEV)
        a.add_(b)              # two storages
        ref = x + x * 2
        assert torch.equal(a.cpu(), ref)
        a2 = x.clone().to(DEV)
        a2.add_(a2)            # one storage twice: x.sub_(x)-style
        assert torch.equal(a2.cpu(), x + x)
        a3 = x.clone().to(DEV)
        a3.sub_(a3)
        assert torch.equal(a3.cpu(), torch.zeros(8))


def test_partial_overlap_still_raises_after_replays():
    t = torch.arange(10.0, device=DEV)
    for _ in range(3):
        t[0:4].add_(t[5:9])  # no overlap: plans replay
    with pytest.raises(RuntimeError, match="unsupported operation"):
        t[0:4].add_(t[2:6])  # same shapes and strides, overlapping: checked, not replayed
    c = torch.arange(10.0)
    for _ in range(3):
        c[0:4].add_(c[5:9])
    assert torch.equal(t.cpu(), c)


def test_scalar_values_change_without_recompiling(metrics):
    x = torch.randn(100)
    t = x.to(DEV)
    (t * 0.5).cpu()
    torchtpu.reset_metrics()
    for s in (0.25, 3.0, -7.5, 1e-3, 0.5):
        assert torch.equal((t * s).cpu(), x * s)
    replays, recorded, compiles = _counts()
    assert compiles == 0 and recorded == 0 and replays == 5


def test_baked_scalar_values_are_checked():
    # add's alpha == 1 lowers to a plain add: alpha is part of the program
    x, y = torch.randn(50), torch.randn(50)
    tx, ty = x.to(DEV), y.to(DEV)
    for alpha in (1, 2, 1, -3, 2):
        assert torch.equal(torch.add(tx, ty, alpha=alpha).cpu(), torch.add(x, y, alpha=alpha))


def test_equal_scalars_sharing_one_argument():
    # clamp(min=v, max=v) passes one program argument for both; other values must not reuse that program
    x = torch.randn(64)
    t = x.to(DEV)
    for lo, hi in ((0.5, 0.5), (-0.5, 0.5), (0.5, 0.5), (-1.0, 0.25), (0.1, 0.1)):
        assert torch.equal(torch.clamp(t, lo, hi).cpu(), torch.clamp(x, lo, hi))


def test_cpu_scalar_tensors_and_wrapped_numbers():
    xi = torch.arange(6, dtype=torch.int32)
    t = xi.to(DEV)
    for other in (torch.tensor(1.5, dtype=torch.float64), 1.5, torch.tensor(2.5, dtype=torch.float64), 2.5,
                  torch.tensor(3, dtype=torch.int64), 3):
        ref = xi + other
        got = t + other
        assert got.dtype == ref.dtype, other
        assert torch.equal(got.cpu(), ref)


def test_out_variant_with_resize():
    a, b = torch.randn(5), torch.randn(5)
    ta, tb = a.to(DEV), b.to(DEV)
    for _ in range(2):
        o = torch.empty(2, device=DEV)
        torch.add(ta, tb, out=o)  # resized: never a plan
        assert torch.equal(o.cpu(), a + b)
        o2 = torch.empty(5, device=DEV)
        torch.add(ta, tb, out=o2)
        assert torch.equal(o2.cpu(), a + b)


def test_random_ops_draw_fresh_keys():
    torch.manual_seed(0)
    torchtpu._C._set_op_plans(False)
    ref = [torch.empty(1000, device=DEV).normal_().cpu() for _ in range(4)]
    torchtpu._C._set_op_plans(True)
    torch.manual_seed(0)
    got = [torch.empty(1000, device=DEV).normal_().cpu() for _ in range(4)]
    for r, g in zip(ref, got):
        assert torch.equal(r, g)
    assert not torch.equal(got[2], got[3])


def test_value_checks_still_raise():
    t = torch.zeros(3, dtype=torch.int8, device=DEV)
    for _ in range(3):
        t.fill_(100)
    with pytest.raises(RuntimeError):
        t.fill_(300)
    assert torch.equal(t.cpu(), torch.full((3,), 100, dtype=torch.int8))


def test_modes_do_not_share_plans():
    x = torch.randn(32)
    t = x.to(DEV)
    for mode in ("strict", "defer_and_fuse", "debug", "strict"):
        with torchtpu.mode(mode):
            got = (t.sin() * 2).cpu()
        assert torch.equal(got, (t.sin() * 2).cpu())
    torch.testing.assert_close(got, x.sin() * 2)


def _train(fused: bool, plans: bool, steps: int = 6):
    prev = torchtpu._C._set_op_plans(plans)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                    torch.nn.Linear(32, 4)).to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused, foreach=None if fused else True)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)  # a new lr every step
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(steps):
            x = torch.randn(8, 16, generator=g).to(DEV)
            y = torch.randint(0, 4, (8,), generator=g).to(DEV)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]
    finally:
        torchtpu._C._set_op_plans(prev)


@pytest.mark.parametrize("fused", [False, True])
def test_training_with_a_scheduler_is_bit_identical_with_and_without_plans(fused, metrics):
    off_losses, off_params = _train(fused, plans=False)
    torchtpu.reset_metrics()
    on_losses, on_params = _train(fused, plans=True)
    assert on_losses == off_losses
    for a, b in zip(on_params, off_params):
        assert torch.equal(a, b)
    m = torchtpu.metrics()
    assert m["plan_replays"] > m["plans_recorded"]
    if fused:
        # the fused step's lr changes every step: one plan, replayed
        assert m["native_ops"].get("aten::_fused_adamw_", 0) == 6


def test_fused_adamw_lr_change_does_not_relower(metrics):
    params = [torch.randn(4, 4, device=DEV, requires_grad=True) for _ in range(3)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, lr=3e-3, fused=True)  # (0.1 would equal 1 - beta1)
    opt.step()
    opt.step()
    before = torchtpu.metrics()["plans_recorded"]
    # (not 0.01: equal to weight_decay, it would share that constant's argument)
    for lr in (0.05, 0.02, 0.2):
        opt.param_groups[0]["lr"] = lr
        opt.step()
    assert torchtpu.metrics()["plans_recorded"] == before


def test_plans_off_by_env(pyrun):
    r = pyrun("import torch, torchtpu\n"
              "x = torch.ones(4, device='tpu')\n"
              "for _ in range(3): y = x + 1\n"
              "print(torchtpu.metrics()['plan_replays'], y.cpu().tolist())",
              env={"TORCHTPU_OP_PLANS": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "0"


def test_a_failed_copy_leaves_nothing_recorded(metrics):
    t = torch.zeros(3, device=DEV)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        t.copy_(torch.zeros(2, 3, device=DEV))
    x = torch.randn(33, device=DEV)
    torchtpu.reset_metrics()
    for _ in range(3):
        y = x * 3
    replays, recorded, _ = _counts()
    assert (replays, recorded) == (2, 1)
    assert torch.equal(y.cpu(), x.cpu() * 3)
