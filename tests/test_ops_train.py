"""Training paths on tpu: random ops, optimizers (foreach), clip_grad_norm_, SDPA, GradScaler."""
import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchtpu  # noqa: F401

D = "tpu"


def fallbacks():
    return dict(torchtpu.metrics()["cpu_fallbacks"])


def new_fallbacks(before):
    after = fallbacks()
    return {k: v for k, v in after.items() if v != before.get(k, 0)}


# ---------------------------------------------------------------- random
def test_randn_reproducible_and_native():
    f0 = fallbacks()
    torch.manual_seed(123)
    a = torch.randn(1000, device=D).cpu()
    b = torch.randn(1000, device=D).cpu()
    torch.manual_seed(123)
    a2 = torch.randn(1000, device=D).cpu()
    assert torch.equal(a, a2)
    assert not torch.equal(a, b)
    assert new_fallbacks(f0) == {}


def test_rng_state_roundtrip():
    torch.manual_seed(7)
    torch.rand(10, device=D)
    st = torch.tpu.get_rng_state()
    x = [torch.randn(17, device=D).cpu(), torch.rand(5, device=D).cpu()]
    torch.tpu.set_rng_state(st)
    y = [torch.randn(17, device=D).cpu(), torch.rand(5, device=D).cpu()]
    for p, q in zip(x, y):
        assert torch.equal(p, q)


def test_generator_argument():
    g = torch.Generator(device=D)
    g.manual_seed(5)
    a = torch.randn(100, device=D, generator=g).cpu()
    g.manual_seed(5)
    b = torch.randn(100, device=D, generator=g).cpu()
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_moments(dtype):
    torch.manual_seed(0)
    n = 200_000
    z = torch.randn(n, device=D, dtype=dtype).cpu().double()
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    assert abs(((z - z.mean()) ** 3).mean()) < 0.05  # symmetric
    u = torch.rand(n, device=D, dtype=dtype).cpu().double()
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.01
    x = torch.empty(n, device=D, dtype=dtype).uniform_(-3, 5).cpu().double()
    assert x.min() >= -3 and x.max() <= 5 and abs(x.mean() - 1) < 0.05
    x = torch.empty(n, device=D, dtype=dtype).normal_(2.0, 3.0).cpu().double()
    assert abs(x.mean() - 2) < 0.05 and abs(x.std() - 3) < 0.05
    e = torch.empty(n, device=D, dtype=dtype).exponential_(2.0).cpu().double()
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 0.02


def test_normal_variants():
    torch.manual_seed(0)
    mean = torch.linspace(-5, 5, 11).repeat(20000).to(D)
    x = torch.normal(mean, 0.5).cpu().view(-1, 11)
    assert torch.allclose(x.mean(0), torch.linspace(-5, 5, 11), atol=0.03)
    std = torch.full((50000,), 2.0, device=D)
    y = torch.normal(1.0, std).cpu()
    assert abs(y.mean() - 1) < 0.05 and abs(y.std() - 2) < 0.05
    z = torch.normal(mean[:1000], std[:1000]).cpu()
    assert z.shape == (1000,)


def test_bernoulli():
    torch.manual_seed(0)
    n = 100_000
    a = torch.empty(n, device=D).bernoulli_(0.3).cpu()
    assert set(a.unique().tolist()) <= {0.0, 1.0} and abs(a.mean() - 0.3) < 0.01
    p = torch.rand(n, device=D)
    b = torch.empty(n, device=D).bernoulli_(p)
    assert abs(b.cpu().mean() - p.cpu().mean()) < 0.01
    c = torch.bernoulli(torch.full((n,), 0.8, device=D)).cpu()
    assert abs(c.mean() - 0.8) < 0.01
    p2 = torch.tensor([0.0, 1.0], device=D).repeat(100)
    assert torch.equal(torch.bernoulli(p2).cpu(), p2.cpu())


def test_random_():
    torch.manual_seed(0)
    x = torch.randint(3, 10, (50000,), device=D).cpu()
    assert x.dtype == torch.int64 and x.min() == 3 and x.max() == 9
    assert abs(x.double().mean() - 6) < 0.05
    y = torch.empty(50000, device=D, dtype=torch.int32).random_(-5, 5).cpu()
    assert y.min() == -5 and y.max() == 4
    z = torch.empty(50000, device=D).random_(100).cpu()
    assert z.min() == 0 and z.max() == 99 and torch.equal(z, z.round())
    w = torch.empty(1000, device=D).random_().cpu()
    assert w.min() >= 0 and w.max() <= 2 ** 24 and torch.equal(w, w.round())
    v = torch.empty(1000, device=D, dtype=torch.uint8).random_().cpu()
    assert v.max() > 200
    b = torch.empty(1000, device=D, dtype=torch.bool).random_().cpu()
    assert 300 < b.sum() < 700


def test_dropout():
    torch.manual_seed(0)
    x = torch.ones(100_000, device=D)
    out, mask = torch.ops.aten.native_dropout(x, 0.25, True)
    out, mask = out.cpu(), mask.cpu()
    assert mask.dtype == torch.bool
    assert abs(mask.float().mean() - 0.75) < 0.01
    assert torch.allclose(out, mask.float() / 0.75)
    out2, mask2 = torch.ops.aten.native_dropout(x, 0.25, False)
    assert torch.equal(out2.cpu(), x.cpu()) and bool(mask2.cpu().all())
    g = torch.randn(100_000, device=D)
    gi = torch.ops.aten.native_dropout_backward(g, mask.to(D), 1 / 0.75).cpu()
    assert torch.allclose(gi, g.cpu() * mask.float() / 0.75)
    # through nn.functional + autograd
    xr = torch.randn(1000, device=D, requires_grad=True)
    y = F.dropout(xr, 0.5, training=True)
    y.sum().backward()
    kept = y.detach().cpu() != 0
    assert torch.allclose(xr.grad.cpu(), kept.float() * 2)


def test_randperm_multinomial():
    torch.manual_seed(0)
    p = torch.randperm(1000, device=D).cpu()
    assert torch.equal(p.sort().values, torch.arange(1000))
    assert not torch.equal(p, torch.arange(1000))
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3], device=D)
    s = torch.multinomial(probs, 4).cpu()
    assert sorted(s.tolist()) == [0, 1, 2, 3] and s[-1] == 1  # zero-prob last
    r = torch.multinomial(probs, 50000, replacement=True).cpu()
    freq = torch.bincount(r, minlength=4).double() / 50000
    assert torch.allclose(freq, probs.cpu().double(), atol=0.01)
    m2 = torch.multinomial(probs.repeat(3, 1), 2).cpu()
    assert m2.shape == (3, 2) and bool((m2 != 1).all())


# ---------------------------------------------------------------- optimizers
def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))


OPTS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_plain": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.5, dampening=0.1),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, weight_decay=0.05),
}


@pytest.mark.parametrize("name", list(OPTS))
def test_optimizer_matches_cpu(name):
    base = make_model()
    mc, mt = copy.deepcopy(base), copy.deepcopy(base).to(D)
    oc, ot = OPTS[name](mc.parameters()), OPTS[name](mt.parameters())
    x = torch.randn(16, 6)
    xt = x.to(D)
    f0 = fallbacks()
    n0 = dict(torchtpu.metrics()["native_ops"])
    for _ in range(4):
        for m, o, xx in ((mc, oc, x), (mt, ot, xt)):
            o.zero_grad()
            (m(xx) ** 2).sum().backward()
            o.step()
    for a, b in zip(mc.parameters(), mt.parameters()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-5)
    assert new_fallbacks(f0) == {}
    n1 = torchtpu.metrics()["native_ops"]
    assert any(k.startswith("aten::_foreach_") and n1[k] > n0.get(k, 0) for k in n1)


def test_lr_change_does_not_recompile():
    m = make_model().to(D)
    o = torch.optim.Adam(m.parameters(), lr=0.1)
    x = torch.randn(16, 6, device=D)
    grown = []
    for i in range(4):
        for g in o.param_groups:
            g["lr"] = 0.1 / (i + 1)
        o.zero_grad()
        m(x).sum().backward()
        c0 = torchtpu.metrics()["compiles"]
        o.step()
        grown.append(torchtpu.metrics()["compiles"] - c0)
    assert grown[1:] == [0, 0, 0], grown
    # SGD with a new lr each step: same program
    o2 = torch.optim.SGD(m.parameters(), lr=0.3, momentum=0.9)
    for i in range(3):
        o2.param_groups[0]["lr"] = 0.3 * (0.5 ** i)
        o2.zero_grad()
        m(x).sum().backward()
        c0 = torchtpu.metrics()["compiles"]
        o2.step()
        if i >= 2:
            assert torchtpu.metrics()["compiles"] == c0


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm(norm_type):
    base = make_model()
    mc, mt = copy.deepcopy(base), copy.deepcopy(base).to(D)
    x = torch.randn(16, 6)
    (mc(x) ** 2).sum().backward()
    (mt(x.to(D)) ** 2).sum().backward()
    f0 = fallbacks()
    a = torch.nn.utils.clip_grad_norm_(mc.parameters(), 0.5, norm_type=norm_type)
    b = torch.nn.utils.clip_grad_norm_(mt.parameters(), 0.5, norm_type=norm_type)
    assert new_fallbacks(f0) == {}
    torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-5)
    for p, q in zip(mc.parameters(), mt.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-6)


def test_foreach_misc():
    xs = [torch.randn(3, 4), torch.randn(5)]
    ys = [torch.randn(3, 4), torch.randn(5)]
    xt, yt = [x.to(D) for x in xs], [y.to(D) for y in ys]
    f0 = fallbacks()
    checks = [
        (torch._foreach_norm(xs, 3.0), torch._foreach_norm(xt, 3.0)),
        (torch._foreach_sub(xs, ys, alpha=2.0), torch._foreach_sub(xt, yt, alpha=2.0)),
        (torch._foreach_div(xs, [2.0, 4.0]), torch._foreach_div(xt, [2.0, 4.0])),
        (torch._foreach_maximum(xs, 0.1), torch._foreach_maximum(xt, 0.1)),
        (torch._foreach_lerp(xs, ys, [0.2, 0.7]), torch._foreach_lerp(xt, yt, [0.2, 0.7])),
        (torch._foreach_addcmul(xs, ys, ys, [0.5, 2.0]), torch._foreach_addcmul(xt, yt, yt, [0.5, 2.0])),
        (torch._foreach_abs(xs), torch._foreach_abs(xt)),
        ([torch.stack(xs[:1] * 3, 1)], [torch.stack(xt[:1] * 3, 1)]),
    ]
    for want, got in checks:
        for a, b in zip(want, got):
            torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
    torch._foreach_zero_(xt)
    assert all(bool((t.cpu() == 0).all()) for t in xt)
    assert new_fallbacks(f0) == {}


# fused=True optimizers: one native op for the whole step (no CPU fallback)
FUSED = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    "adamw_amsgrad_wd": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, weight_decay=0.05, fused=True),
    "adam_wd_maximize": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1, maximize=True, fused=True),
    "adam_tensor_lr": lambda p: torch.optim.Adam(p, lr=torch.tensor(0.01), fused=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01,
                                              fused=True),
    "sgd_plain": lambda p: torch.optim.SGD(p, lr=0.01, fused=True),
    "sgd_dampening": lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.5, dampening=0.1, fused=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, weight_decay=0.01, fused=True),
}


@pytest.mark.parametrize("name", list(FUSED))
def test_fused_optimizer_matches_cpu(name):
    base = make_model()
    x = torch.randn(16, 6)
    f0 = fallbacks()
    res, native = [], torchtpu.metrics()["native_ops"]
    n0 = sum(v for k, v in native.items() if k.startswith("aten::_fused_"))
    for dev in ("cpu", D):
        m = copy.deepcopy(base).to(dev)
        o = FUSED[name](m.parameters())
        for _ in range(4):
            o.zero_grad()
            (m(x.to(dev)) ** 2).sum().backward()
            o.step()
        res.append([p.detach().cpu() for p in m.parameters()] +
                   [v.cpu() for st in o.state.values() for v in st.values() if torch.is_tensor(v)])
    assert new_fallbacks(f0) == {}
    n1 = sum(v for k, v in torchtpu.metrics()["native_ops"].items() if k.startswith("aten::_fused_"))
    assert n1 - n0 == 4
    assert len(res[0]) == len(res[1])
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["adam", "adamw", "sgd", "adagrad"])
def test_fused_op_grad_scale_found_inf(op):
    # grad_scale unscales the grads in place (as CPU does); found_inf == 1 skips the step
    torch.manual_seed(1)
    shapes = [(3, 4), (5,)]
    for found_v in (0.0, 1.0):
        outs = []
        for dev in ("cpu", D):
            torch.manual_seed(2)
            ps, gs, st, st2 = ([torch.randn(s).to(dev) if i < 2 else torch.rand(s).to(dev) for s in shapes]
                               for i in range(4))
            steps = [torch.tensor(3.0, device=dev) for _ in shapes]
            scale = torch.tensor(4.0, device=dev)
            found = torch.tensor(found_v, device=dev)
            kw = dict(grad_scale=scale, found_inf=found)
            if op in ("adam", "adamw"):
                fn = torch._fused_adam_ if op == "adam" else torch._fused_adamw_
                fn(ps, gs, st, st2, [], steps, lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8,
                   amsgrad=False, maximize=False, **kw)
            elif op == "sgd":
                torch._fused_sgd_(ps, gs, st, weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.0,
                                  nesterov=False, maximize=False, is_first_step=False, **kw)
            else:
                torch._fused_adagrad_(ps, gs, st, steps, lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10,
                                      maximize=True, **kw)
            outs.append([t.cpu() for t in ps + gs + st + st2])
        for a, b in zip(*outs):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_fused_optimizer_lr_change_and_bad_lists():
    m = make_model().to(D)
    o = torch.optim.AdamW(m.parameters(), lr=0.1, fused=True)
    x = torch.randn(16, 6, device=D)
    grown = []
    for i in range(4):
        o.param_groups[0]["lr"] = 0.1 / (i + 1)
        o.zero_grad()
        m(x).sum().backward()
        c0 = torchtpu.metrics()["compiles"]
        o.step()
        grown.append(torchtpu.metrics()["compiles"] - c0)
    assert grown[2:] == [0, 0], grown
    ps = [torch.zeros(3, device=D), torch.zeros(2, device=D)]
    with pytest.raises(RuntimeError, match="grads"):
        torch._fused_adam_(ps, ps[:1], [p.clone() for p in ps], [p.clone() for p in ps], [],
                           [torch.tensor(1.0, device=D)] * 2, lr=torch.tensor(0.1), beta1=0.9, beta2=0.99,
                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)


def test_fused_optimizer_bf16():
    base = make_model().to(torch.bfloat16)
    x = torch.randn(16, 6, dtype=torch.bfloat16)
    res = []
    for dev in ("cpu", D):
        m = copy.deepcopy(base).to(dev)
        o = torch.optim.AdamW(m.parameters(), lr=0.01, fused=True)
        for _ in range(3):
            o.zero_grad()
            m(x.to(dev)).float().pow(2).sum().backward()
            o.step()
        res.append([p.detach().float().cpu() for p in m.parameters()])
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------- GradScaler
def test_amp_scaler_ops():
    g = [torch.tensor([1.0, 2.0]), torch.tensor([[4.0]])]
    gt = [t.to(D) for t in g]
    found = torch.zeros(1, device=D)
    inv = torch.tensor(0.5, device=D)
    torch._amp_foreach_non_finite_check_and_unscale_(gt, found, inv)
    assert found.item() == 0.0
    torch.testing.assert_close(gt[0].cpu(), g[0] * 0.5)
    gt[1].fill_(float("inf"))
    torch._amp_foreach_non_finite_check_and_unscale_(gt, found, inv)
    assert found.item() == 1.0
    for found_v, steps in ((0.0, 1), (0.0, 2), (1.0, 1)):
        res = []
        for dev in ("cpu", D):
            scale = torch.tensor([8.0], device=dev)
            tracker = torch.tensor([0], dtype=torch.int32, device=dev)
            for _ in range(steps):
                torch._amp_update_scale_(scale, tracker, torch.tensor([found_v], device=dev), 2.0, 0.5, 2)
            res.append((scale.cpu(), tracker.cpu()))
        assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1]), (found_v, steps, res)


# a fused optimizer gets grad_scale / found_inf from the scaler in its step
@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_training_matches_cpu(fused):
    base = make_model()
    x = torch.randn(16, 6)
    out = []
    f0 = fallbacks()
    for dev in ("cpu", D):
        m = copy.deepcopy(base).to(dev)
        o = (torch.optim.Adam(m.parameters(), lr=0.01, fused=True) if fused
             else torch.optim.SGD(m.parameters(), lr=0.01))
        sc = torch.amp.GradScaler(dev, init_scale=256.0, growth_interval=2)
        for i in range(4):
            o.zero_grad()
            sc.scale((m(x.to(dev)) ** 2).sum()).backward()
            if i == 1:
                with torch.no_grad():
                    next(m.parameters()).grad[0, 0] = float("inf")
            sc.step(o)
            sc.update()
        out.append(([p.detach().cpu() for p in m.parameters()], sc.get_scale()))
    assert new_fallbacks(f0) == {}
    assert out[0][1] == out[1][1]
    for a, b in zip(out[0][0], out[1][0]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- attention
def _sdpa_case(q, k, v, **kw):
    res = []
    for dev in ("cpu", D):
        qq, kk, vv = [t.detach().clone().to(dev).requires_grad_() for t in (q, k, v)]
        kw2 = {a: (b.to(dev) if torch.is_tensor(b) else b) for a, b in kw.items()}
        o = F.scaled_dot_product_attention(qq, kk, vv, **kw2)
        (o * o).sum().backward()
        res.append([o.detach().cpu(), qq.grad.cpu(), kk.grad.cpu(), vv.grad.cpu()])
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def _bool_mask():
    m = torch.rand(5, 6) > 0.4
    m[:, 0] = True
    return m


@pytest.mark.parametrize("variant", ["plain", "causal", "bool_mask", "float_mask", "gqa", "scale"])
def test_sdpa_matches_cpu(variant):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    kw = {}
    if variant == "causal":
        kw["is_causal"] = True
    elif variant == "bool_mask":
        kw["attn_mask"] = _bool_mask()
    elif variant == "float_mask":
        kw["attn_mask"] = torch.randn(2, 1, 5, 6)
    elif variant == "gqa":
        k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
        kw["enable_gqa"] = True
    elif variant == "scale":
        kw["scale"] = 0.3
    f0 = fallbacks()
    _sdpa_case(q, k, v, **kw)
    assert new_fallbacks(f0) == {}


def test_sdpa_dropout():
    torch.manual_seed(2)
    q = torch.randn(2, 2, 6, 8, device=D, requires_grad=True)
    f0 = fallbacks()
    o1 = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    o1.sum().backward()
    assert new_fallbacks(f0) == {}
    assert q.grad is not None and torch.isfinite(q.grad.cpu()).all()
    o2 = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert not torch.equal(o1.detach().cpu(), o2.detach().cpu())
    torch.manual_seed(3)
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3).detach().cpu()
    torch.manual_seed(3)
    b = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3).detach().cpu()
    assert torch.equal(a, b)
