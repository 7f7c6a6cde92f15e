"""Native lowerings of activations, losses, matmul extras and elementwise
math: tpu vs CPU (values and gradients), with no CPU fallbacks."""
import functools
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchtpu

warnings.filterwarnings("ignore", message=".*native tpu lowering.*")
DEV = "tpu"


from optest import _to, check as _check  # noqa: E402

# NaN gradients (kinks, poles) must match CPU's NaNs here
check = functools.partial(_check, grad_equal_nan=True)


torch.manual_seed(0)
X = torch.randn(4, 6) * 3
X[0, :3] = torch.tensor([0.0, 3.0, -3.0])  # kinks
T = torch.randn(4, 6)
P = torch.rand(4, 6)
LBL = torch.tensor([0, 5, 2, 3])

ACTS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "mish": F.mish,
    "softplus": F.softplus,
    "softplus_beta": lambda x: F.softplus(x, beta=2, threshold=3),
    "elu": F.elu,
    "elu_alpha": lambda x: F.elu(x, alpha=0.3),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, 0.5),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "hardtanh": lambda x: F.hardtanh(x, -0.5, 0.7),
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "logsigmoid": F.logsigmoid,
    "glu": lambda x: F.glu(x, -1),
    "glu0": lambda x: F.glu(x, 0),
    "softshrink": lambda x: F.softshrink(x, 0.7),
    "hardshrink": F.hardshrink,
    "threshold": lambda x: F.threshold(x, 0.1, 20.0),
    "rrelu_eval": lambda x: F.rrelu(x, training=False),
    "tanhshrink": F.tanhshrink,
    "softsign": F.softsign,
    "elu_inplace": lambda x: F.elu_(x * 1.0),
    "leaky_relu_inplace": lambda x: F.leaky_relu_(x * 1.0, 0.1),
    "hardtanh_inplace": lambda x: F.hardtanh_(x * 1.0),
    "logit": lambda x: torch.logit(torch.sigmoid(x)),
    "logit_eps": lambda x: torch.logit(torch.sigmoid(x), 0.2),
}


@pytest.mark.parametrize("name", sorted(ACTS))
def test_activation(name):
    f = ACTS[name]
    check(lambda d, x: f(x), X)


@pytest.mark.parametrize("name", ["gelu", "silu", "mish", "softplus", "elu", "leaky_relu", "hardswish",
                                  "hardtanh", "logsigmoid", "glu", "softshrink"])
def test_activation_bf16(name):
    f = ACTS[name]
    check(lambda d, x: f(x), X.bfloat16(), atol=2e-2, rtol=2e-2)


def test_prelu():
    x = torch.randn(3, 4, 5)
    check(lambda d, x, w: F.prelu(x, w), x, torch.tensor([0.25]))
    check(lambda d, x, w: F.prelu(x, w), x, torch.rand(4))


def test_rrelu_training():
    torch.manual_seed(1)
    x = torch.randn(64, 32, device=DEV, requires_grad=True)
    torchtpu.reset_metrics()
    y = F.rrelu(x, 0.1, 0.3, training=True)
    (g,) = torch.autograd.grad(y.sum(), x)
    xc, yc, gc = x.detach().cpu(), y.detach().cpu(), g.cpu()
    pos = xc > 0
    torch.testing.assert_close(yc[pos], xc[pos])
    slope = yc[~pos] / xc[~pos]
    assert slope.min() >= 0.1 - 1e-6 and slope.max() <= 0.3 + 1e-6 and slope.std() > 0.01
    torch.testing.assert_close(gc[~pos], slope)
    assert not torchtpu.metrics()["cpu_fallbacks"]


_FDT = [torch.float32]  # dtype of float loss targets/weights


def _t(v, d):
    return v.to(d, _FDT[0] if v.is_floating_point() else v.dtype)


LOSSES = {
    "ce": lambda d, x, r: F.cross_entropy(x, _t(LBL, d), reduction=r),
    "ce_ls": lambda d, x, r: F.cross_entropy(x, _t(LBL, d), label_smoothing=0.1, reduction=r),
    "ce_w_ignore": lambda d, x, r: F.cross_entropy(x, _t(LBL, d), weight=_t(P[0], d), ignore_index=2,
                                                   reduction=r),
    "ce_prob": lambda d, x, r: F.cross_entropy(x, _t(P.softmax(-1), d), reduction=r),
    "ce_prob_ls_w": lambda d, x, r: F.cross_entropy(x, _t(P.softmax(-1), d), label_smoothing=0.2,
                                                    weight=_t(P[1], d), reduction=r),
    "nll": lambda d, x, r: F.nll_loss(F.log_softmax(x, -1), _t(LBL, d), reduction=r),
    "mse": lambda d, x, r: F.mse_loss(x, _t(T, d), reduction=r),
    "l1": lambda d, x, r: F.l1_loss(x, _t(T, d), reduction=r),
    "smooth_l1": lambda d, x, r: F.smooth_l1_loss(x, _t(T, d), reduction=r, beta=0.5),
    "smooth_l1_beta0": lambda d, x, r: F.smooth_l1_loss(x, _t(T, d), reduction=r, beta=0.0),
    "huber": lambda d, x, r: F.huber_loss(x, _t(T, d), reduction=r, delta=0.7),
    "bce": lambda d, x, r: F.binary_cross_entropy(torch.sigmoid(x), _t(P, d), reduction=r),
    "bce_w": lambda d, x, r: F.binary_cross_entropy(torch.sigmoid(x), _t(P, d), weight=_t(P[2], d),
                                                    reduction=r),
    "bce_logits": lambda d, x, r: F.binary_cross_entropy_with_logits(x, _t(P, d), reduction=r),
    "bce_logits_pw": lambda d, x, r: F.binary_cross_entropy_with_logits(
        x, _t(P, d), weight=_t(P[3], d), pos_weight=_t(P[0] * 2, d), reduction=r),
    "kl": lambda d, x, r: F.kl_div(F.log_softmax(x, -1), _t(P, d), reduction=r),
    "kl_log_target": lambda d, x, r: F.kl_div(F.log_softmax(x, -1), _t(P.log(), d), reduction=r,
                                              log_target=True),
    "soft_margin": lambda d, x, r: F.soft_margin_loss(x, _t(T.sign(), d), reduction=r),
    "multilabel_soft_margin": lambda d, x, r: F.multilabel_soft_margin_loss(x, _t((P > 0.5).float(), d),
                                                                            reduction=r),
    "cosine_embedding": lambda d, x, r: F.cosine_embedding_loss(x, _t(T, d), _t(torch.tensor([1, -1, 1, -1.]), d),
                                                                reduction=r),
    "margin_ranking": lambda d, x, r: F.margin_ranking_loss(x[:, 0], _t(T[:, 0], d),
                                                            _t(torch.tensor([1, -1, 1, -1.]), d), reduction=r),
    "hinge_embedding": lambda d, x, r: F.hinge_embedding_loss(x, _t(T.sign(), d), reduction=r),
    "poisson_nll": lambda d, x, r: F.poisson_nll_loss(x, _t(P, d), reduction=r),
    "gaussian_nll": lambda d, x, r: F.gaussian_nll_loss(x, _t(T, d), _t(P + 0.1, d), reduction=r),
    "triplet": lambda d, x, r: F.triplet_margin_loss(x, _t(T, d), _t(P, d), reduction=r),
}


@pytest.mark.parametrize("red", ["none", "mean", "sum"])
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss(name, red):
    f = LOSSES[name]
    check(lambda d, x: f(d, x, red), X, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("red", ["mean", "none"])
def test_multi_margin(red):
    # forward native; multi_margin_loss_backward has no meta kernel (CPU fallback)
    for p in (1, 2):
        check(lambda d, x: F.multi_margin_loss(x, _t(LBL, d), p=p, margin=0.8, weight=_t(P[0], d),
                                               reduction=red), X,
              allowed=("aten::multi_margin_loss_backward",))


@pytest.mark.parametrize("name", ["ce_ls", "smooth_l1", "huber", "bce", "bce_logits_pw", "kl"])
def test_loss_bf16(name):
    f = LOSSES[name]
    _FDT[0] = torch.bfloat16
    try:
        check(lambda d, x: f(d, x, "mean"), X.bfloat16(), atol=3e-2, rtol=3e-2)
    finally:
        _FDT[0] = torch.float32


# ---- matmul family ----
A = torch.randn(4, 6)
B3 = torch.randn(3, 4, 5)
C3 = torch.randn(3, 5, 6)
MATMULS = {
    "addbmm": lambda d, a, b, c: torch.addbmm(a[:, :6], b, c, beta=0.5, alpha=2),
    "baddbmm": lambda d, a, b, c: torch.baddbmm(a[:, :6], b, c, beta=0.5, alpha=2),
    "einsum": lambda d, a, b, c: torch.einsum("bij,bjk->ik", b, c),
    "einsum_outer": lambda d, a, b, c: torch.einsum("i,j->ij", a[0], a[1]),
    "tensordot": lambda d, a, b, c: torch.tensordot(b, c, dims=([0, 2], [0, 1])),
    "outer": lambda d, a, b, c: torch.outer(a[0], a[1]),
    "dot": lambda d, a, b, c: torch.dot(a[0], a[1]),
    "linear": lambda d, a, b, c: F.linear(b, a[:, :5], a[0, :4]),
    "linear_nobias": lambda d, a, b, c: F.linear(b, a[:, :5]),
    "mv": lambda d, a, b, c: torch.mv(a, a[0]),
    "addmv": lambda d, a, b, c: torch.addmv(a[:, 0], a, a[1], beta=2),
    "addr": lambda d, a, b, c: torch.addr(a, a[:, 0], a[0]),
    "matmul_bcast": lambda d, a, b, c: b @ c[0],
    "multi_dot": lambda d, a, b, c: torch.linalg.multi_dot([a, a.T, a]),
}


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_matmul(name):
    f = MATMULS[name]
    check(f, A, B3, C3, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_matmul_half_accumulates_f32(dt):
    # long contraction: per-step rounding in dt would drift far from CPU
    a, b = torch.randn(8, 512).to(dt), torch.randn(512, 8).to(dt)
    bias = torch.randn(8).to(dt)
    check(lambda d, a, b: a @ b, a, b, grad=False, atol=0, rtol=0)
    check(lambda d, a, b: torch.addmm(bias.to(d), a, b), a, b, grad=False, atol=1e-2, rtol=1e-2)
    check(lambda d, a, b: torch.bmm(a.reshape(2, 4, 512), b.reshape(2, 512, 4)), a, b, grad=False,
          atol=1e-2, rtol=1e-2)


def test_matmul_int():
    a, b = torch.randint(-9, 9, (5, 7)), torch.randint(-9, 9, (7, 3))
    check(lambda d, a, b: a @ b, a, b, grad=False)
    check(lambda d, a, b: torch.bmm(a.expand(2, 5, 7), b.expand(2, 7, 3)), a, b, grad=False)
    check(lambda d, a, b: torch.mv(a, b[:, 0]), a, b, grad=False)


def test_vdot_complex():
    a, b = torch.randn(6, dtype=torch.complex64), torch.randn(6, dtype=torch.complex64)
    check(lambda d, a, b: torch.vdot(a, b), a, b, grad=False)
    check(lambda d, a, b: torch.dot(a, b), a, b, grad=False)


def test_addmm_activation():
    a, b, bias = torch.randn(4, 5), torch.randn(5, 3), torch.randn(3)
    for g in (False, True):
        check(lambda d, a, b: torch._addmm_activation(bias.to(d), a, b, beta=0.5, use_gelu=g), a, b,
              grad=False)


# ---- elementwise ----
Y = torch.randn(4, 6)
XI = torch.randint(-7, 8, (4, 6))
YI = torch.randint(1, 6, (4, 6)) * torch.tensor([1, -1]).repeat(3)
SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.5])
XC = torch.randn(4, 6, dtype=torch.complex64)

ELEM = {
    "pow_neg_int": (lambda d, x, y: torch.pow(x, -2), X, Y),
    "pow_neg_frac": (lambda d, x, y: torch.pow(x.abs() + 0.1, -1.5), X, Y),
    "pow_tensor": (lambda d, x, y: torch.pow(x.abs() + 0.1, y), X, Y),
    "xlogy": (lambda d, x, y: torch.xlogy(x.abs() * (x > 0), y.abs()), X, Y),
    "xlogy_scalar": (lambda d, x, y: torch.xlogy(x, 2.0), X, Y),
    "xlog1py": (lambda d, x, y: torch.special.xlog1py(x, y.abs()), X, Y),
    "logaddexp": (lambda d, x, y: torch.logaddexp(x, y), X, Y),
    "logaddexp2": (lambda d, x, y: torch.logaddexp2(x, y), X, Y),
    "hypot": (lambda d, x, y: torch.hypot(x, y), X, Y),
    "copysign": (lambda d, x, y: torch.copysign(x, y), X, Y),
    "heaviside": (lambda d, x, y: torch.heaviside(x.round(), y).detach(), X, Y),
    "sinc": (lambda d, x, y: torch.sinc(x.round()), X, Y),
    "erfc": (lambda d, x, y: torch.erfc(x), X, Y),
    "i1e": (lambda d, x, y: torch.special.i1e(x.detach()), X, Y),  # backward needs i0e (not lowered)
    "entr": (lambda d, x, y: torch.special.entr(x), X, Y),
    "ndtri": (lambda d, x, y: torch.special.ndtri(torch.sigmoid(x)), X, Y),
    "polygamma1": (lambda d, x, y: torch.polygamma(1, x.abs() + 0.5), X, Y),
    "round_decimals": (lambda d, x, y: torch.round(x * 100, decimals=-1), X, Y),
    "round_decimals2": (lambda d, x, y: torch.round(x, decimals=2), X, Y),
    "float_power": (lambda d, x, y: torch.float_power(x, 2), X, Y),
    "floor_divide": (lambda d, x, y: torch.floor_divide(x.detach(), y.detach()), X, Y),
    "true_divide": (lambda d, x, y: torch.true_divide(x, y), X, Y),
    "logit_grad": (lambda d, x, y: torch.logit(torch.sigmoid(x) * 1.2 - 0.1), X, Y),
}


@pytest.mark.parametrize("name", sorted(ELEM))
def test_elementwise(name):
    f, x, y = ELEM[name]
    check(f, x, y, atol=1e-5, rtol=1e-4)


def test_elementwise_special_values():
    s = SPECIAL
    check(lambda d, x: (torch.nan_to_num(x), torch.nan_to_num(x, 1.0, 2.0, -3.0)), s, grad=False)
    check(lambda d, x: torch.nan_to_num(x), s.bfloat16(), grad=False)
    check(lambda d, x: (torch.isinf(x), torch.isposinf(x), torch.isneginf(x), torch.signbit(x)), s, grad=False)
    check(lambda d, x: torch.nextafter(x, torch.ones_like(x)), s, grad=False)
    check(lambda d, x: torch.nextafter(x, -torch.ones_like(x)), s.bfloat16(), grad=False)
    check(lambda d, x: torch.copysign(torch.ones_like(x), x), s, grad=False)
    check(lambda d, x: torch.logaddexp(x, x), s, grad=False)
    check(lambda d, x: torch.xlogy(torch.zeros_like(x), x), s, grad=False)
    check(lambda d, x: torch.angle(x), s, grad=False)


def test_polygamma_digamma_poles_and_inplace():
    # Poles (0, -0, negative integers) as CPU: values and grads (digamma' = trigamma,
    # which CPU leaves huge-but-finite at negative integers); polygamma_(self, n).
    x = torch.tensor([0., -0., -1., -2., -3., 0.5, 1., 2.5, -1.5, 30.])
    for n in range(5):
        check(lambda d, x: torch.polygamma(n, x), x, atol=1e-4, rtol=1e-4)
        check(lambda d, x: torch.special.polygamma(n, x), x, atol=1e-4, rtol=1e-4)
    check(lambda d, x: torch.digamma(x), x, atol=1e-4, rtol=1e-4)
    for n in range(4):
        check(lambda d, x: x.clone().polygamma_(n), x, grad=False, atol=1e-4, rtol=1e-4)


def test_elementwise_int_bool():
    x, y = XI, YI
    b = XI > 0
    check(lambda d, x, y: (torch.floor_divide(x, y), torch.floor_divide(x, 3), x // -2), x, y, grad=False)
    check(lambda d, x, y: (torch.gcd(x, y), torch.lcm(x, y)), x, y, grad=False)
    check(lambda d, x, y: (torch.clamp(x, -2, 3), torch.clamp(x, min=-2), torch.clamp(x, -2.5, 3.5)), x, y,
          grad=False)
    check(lambda d, x, y: (x.trunc(), x.round(), x.floor(), x.ceil(), x.sign(), x.abs(), -x, x.square()),
          x, y, grad=False)
    check(lambda d, x, y: (torch.isinf(x), torch.isposinf(x), torch.isnan(x), torch.signbit(x)), x, y,
          grad=False)
    check(lambda d, x, y: (x.sin(), x.sigmoid(), torch.true_divide(x, y), torch.pow(x, 2), torch.float_power(x, y)),
          x, y, grad=False)
    check(lambda d, x, y: (torch.heaviside(x, y), torch.copysign(x, y), torch.nan_to_num(x)), x, y, grad=False)
    check(lambda d, x, y: (x.abs().to(torch.uint8) >> 1, x << 2, x >> 1, x.abs().to(torch.uint8) << 1), x, y,
          grad=False)
    check(lambda d, b: (b.sign(), b.exp(), b + b, b * b, torch.logical_and(b, ~b)), b, grad=False)
    check(lambda d, x, y: (x.max(), torch.maximum(x, y), x % y, torch.fmod(x, y), x * 1.5, x / y), x, y,
          grad=False)


def test_complex():
    x, y = X, Y
    check(lambda d, x, y: (torch.complex(x, y), torch.polar(x.abs(), y)), x, y, grad=False)
    c = XC
    check(lambda d, c: (torch.real(c).clone(), torch.imag(c).clone(), torch.angle(c), torch.abs(c)), c,
          grad=False)
    check(lambda d, c: (torch.conj(c).resolve_conj(), torch.conj_physical(c), torch.conj(c).imag.clone()), c,
          grad=False)
    check(lambda d, c: (torch.conj(c) * c, torch.view_as_real(c).clone(), c.exp()), c, grad=False)
    t = c.to(DEV).conj()
    torch.testing.assert_close(t.cpu(), c.conj())


def test_error_types():
    with pytest.raises(RuntimeError):
        F.glu(torch.randn(3, 5, device=DEV), -1)  # odd size
    with pytest.raises(RuntimeError):
        F.smooth_l1_loss(torch.randn(3, device=DEV), torch.randn(4, device=DEV))
