"""Native lowerings of convolution, pooling, upsampling, padding and
normalization ops: tpu vs CPU (forward and backward), with no CPU fallbacks;
BatchNorm running stats updated in place; a small CNN trained end to end."""
import functools
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu

warnings.filterwarnings("ignore", message=".*native tpu lowering.*")
DEV = "tpu"


from optest import check as _check  # noqa: E402

# fn(*inputs); float32 tolerance 1e-4 unless a test says otherwise; NaNs never match
check = functools.partial(_check, pass_dev=False, atol=1e-4, rtol=1e-4, equal_nan=False)


torch.manual_seed(0)
X1, X2, X3 = torch.randn(2, 4, 11), torch.randn(2, 4, 9, 8), torch.randn(1, 4, 5, 6, 5)
B6 = torch.randn(6)

CONV = {
    "conv1d": (lambda x, w: F.conv1d(x, w, stride=3, padding=2), X1, torch.randn(6, 4, 3)),
    "conv2d_bias": (lambda x, w, b: F.conv2d(x, w, b), X2, torch.randn(6, 4, 3, 3), B6),
    "conv2d_sdp": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2), X2,
                   torch.randn(6, 4, 3, 3), B6),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 0), groups=2), X2,
                      torch.randn(6, 2, 3, 2)),
    "conv2d_depthwise": (lambda x, w: F.conv2d(x, w, padding="same", groups=4), X2, torch.randn(4, 1, 3, 3)),
    "conv3d": (lambda x, w: F.conv3d(x, w, padding=1, groups=2), X3, torch.randn(4, 2, 3, 3, 3)),
    "convT1d": (lambda x, w: F.conv_transpose1d(x, w, stride=3), torch.randn(2, 4, 7), torch.randn(4, 5, 2)),
    "convT2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1), X2,
                torch.randn(4, 3, 3, 3), torch.randn(3)),
    "convT2d_groups_dil": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, groups=2, dilation=2), X2,
                           torch.randn(4, 3, 3, 3)),
    "convT3d": (lambda x, w: F.conv_transpose3d(x, w, stride=2), torch.randn(1, 4, 3, 4, 3),
                torch.randn(4, 2, 3, 3, 3)),
}


@pytest.mark.parametrize("name", list(CONV))
def test_conv(name):
    fn, *ins = CONV[name]
    check(fn, *ins)


def test_conv_bf16():
    torchtpu.reset_metrics()
    x, w = torch.randn(2, 4, 9, 8, dtype=torch.bfloat16), torch.randn(6, 4, 3, 3, dtype=torch.bfloat16)
    r = F.conv2d(x.to(DEV), w.to(DEV), padding=1)
    assert r.dtype == torch.bfloat16
    torch.testing.assert_close(r.cpu().float(), F.conv2d(x.float(), w.float(), padding=1), atol=0.1, rtol=0.02)
    assert not torchtpu.metrics()["cpu_fallbacks"]


POOL = {
    "max_pool2d": lambda i: F.max_pool2d(i, 2, return_indices=True),
    "max_pool2d_ceil_pad": lambda i: F.max_pool2d(i, 3, stride=2, padding=1, ceil_mode=True, return_indices=True),
    "max_pool2d_dil": lambda i: F.max_pool2d(i, (3, 2), stride=(2, 1), padding=(1, 1), dilation=(2, 1),
                                             return_indices=True),
    "max_pool1d": lambda i: F.max_pool1d(i.flatten(2), 3, stride=2, return_indices=True),
    "max_pool3d": lambda i: F.max_pool3d(i.unsqueeze(2).expand(-1, -1, 3, -1, -1) * 1.0, 2, stride=2, padding=1,
                                         ceil_mode=True, return_indices=True),
    "avg_pool2d": lambda i: F.avg_pool2d(i, 2),
    "avg_pool2d_ceil_pad": lambda i: F.avg_pool2d(i, 3, stride=2, padding=1, ceil_mode=True),
    "avg_pool2d_exclude_pad": lambda i: F.avg_pool2d(i, 3, stride=2, padding=1, ceil_mode=True,
                                                     count_include_pad=False),
    "avg_pool2d_divisor": lambda i: F.avg_pool2d(i, (3, 2), stride=(1, 2), padding=(1, 0), divisor_override=5),
    "avg_pool1d": lambda i: F.avg_pool1d(i.flatten(2), 4, stride=3, padding=2),
    "avg_pool3d": lambda i: F.avg_pool3d(i.reshape(2, 4, 3, 4, 6), 3, stride=2, padding=1,
                                         count_include_pad=False),
    "adaptive_avg_pool2d": lambda i: F.adaptive_avg_pool2d(i, (4, 3)),
    "adaptive_avg_pool2d_up": lambda i: F.adaptive_avg_pool2d(i, (5, 11)),
    "adaptive_avg_pool1d": lambda i: F.adaptive_avg_pool1d(i.flatten(2), 5),
    "adaptive_avg_pool3d": lambda i: F.adaptive_avg_pool3d(i.reshape(2, 4, 3, 4, 6), (2, 3, 4)),
    "adaptive_max_pool2d": lambda i: F.adaptive_max_pool2d(i, (4, 3), return_indices=True),
    "adaptive_max_pool1d": lambda i: F.adaptive_max_pool1d(i.flatten(2), 5, return_indices=True),
    "nearest2d": lambda i: F.interpolate(i, scale_factor=2),
    "nearest2d_size": lambda i: F.interpolate(i, size=(5, 13)),
    "nearest2d_frac": lambda i: F.interpolate(i, scale_factor=1.7),
    "nearest_exact2d": lambda i: F.interpolate(i, size=(5, 13), mode="nearest-exact"),
    "nearest1d": lambda i: F.interpolate(i.flatten(2), scale_factor=3),
    "nearest3d": lambda i: F.interpolate(i.reshape(2, 4, 3, 4, 6), size=(7, 3, 9)),
    "nearest_exact3d": lambda i: F.interpolate(i.reshape(2, 4, 3, 4, 6), size=(7, 3, 9), mode="nearest-exact"),
    "bilinear": lambda i: F.interpolate(i, scale_factor=2, mode="bilinear"),
    "bilinear_align": lambda i: F.interpolate(i, size=(5, 13), mode="bilinear", align_corners=True),
    "bilinear_frac": lambda i: F.interpolate(i, scale_factor=1.7, mode="bilinear"),
    "bilinear_down": lambda i: F.interpolate(i, size=(4, 3), mode="bilinear"),
    "reflect1d": lambda i: F.pad(i.flatten(2), (2, 3), mode="reflect"),
    "reflect2d": lambda i: F.pad(i, (1, 2, 3, 0), mode="reflect"),
    "reflect3d": lambda i: F.pad(i.reshape(2, 4, 3, 4, 6), (1, 2, 3, 0, 1, 1), mode="reflect"),
    "replicate1d": lambda i: F.pad(i.flatten(2), (2, 3), mode="replicate"),
    "replicate2d": lambda i: F.pad(i, (1, 2, 3, 0), mode="replicate"),
    "replicate3d": lambda i: F.pad(i.reshape(2, 4, 3, 4, 6), (1, 2, 3, 0, 1, 1), mode="replicate"),
}


@pytest.mark.parametrize("name", list(POOL))
def test_pool_upsample_pad(name):
    x = torch.randn(2, 4, 9, 8)
    check(POOL[name], x, atol=1e-5, rtol=1e-5)


def test_max_pool_ties_and_unbatched():
    # equal values in a window: the first index wins, as on CPU
    x = torch.zeros(3, 6, 6)
    x[:, 1:3, 1:3] = 1.0
    check(lambda i: F.max_pool2d(i, 2, return_indices=True), x)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("shape", [(6, 4), (5, 4, 7), (3, 4, 5, 6), (2, 4, 3, 2, 3)])
def test_batch_norm_module(shape, train):
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    m = cls(4)
    with torch.no_grad():
        m.running_mean.uniform_()
        m.running_var.uniform_(0.5, 2)
        m.weight.uniform_()
        m.bias.uniform_()
    mt = cls(4).to(DEV)
    mt.load_state_dict(m.state_dict())
    m.train(train)
    mt.train(train)
    rm, rv = mt.running_mean, mt.running_var
    for _ in range(2):
        check(lambda i: (m if i.device.type == "cpu" else mt)(i), torch.randn(shape))
    # updated in place (same tensors), exactly as CPU's momentum / unbiased var
    assert mt.running_mean is rm and mt.running_var is rv
    torch.testing.assert_close(mt.running_mean.cpu(), m.running_mean)
    torch.testing.assert_close(mt.running_var.cpu(), m.running_var)
    assert mt.num_batches_tracked.item() == m.num_batches_tracked.item()


def test_batch_norm_functional():
    x = torch.randn(4, 3, 5)
    check(lambda i: F.batch_norm(i, None, None, training=True), x)
    rm, rv = torch.zeros(3), torch.ones(3)
    rmt, rvt = rm.to(DEV), rv.to(DEV)
    F.batch_norm(x, rm, rv, training=True, momentum=0.3)
    F.batch_norm(x.to(DEV), rmt, rvt, training=True, momentum=0.3)
    torch.testing.assert_close(rmt.cpu(), rm)
    torch.testing.assert_close(rvt.cpu(), rv)


def test_group_norm_and_var_mean():
    x = torch.randn(3, 4, 5, 6)
    check(lambda i, w, b: F.group_norm(i, 2, w, b), x, torch.randn(4), torch.randn(4))
    check(lambda i: F.group_norm(i, 4), torch.randn(2, 4, 3))
    check(lambda i: nn.GroupNorm(1, 4).to(i.device)(i), x)
    check(lambda i: torch.var_mean(i, (0, 2), correction=0), x)
    check(lambda i: torch.var_mean(i, 1, keepdim=True), x)


def test_rms_norm():
    check(lambda i, w: F.rms_norm(i, (6,), w), torch.randn(3, 4, 6), torch.randn(6))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.c1(x))))
        x = self.pool(F.relu(self.bn2(self.c2(x))))
        return self.fc(torch.flatten(self.gap(x), 1))


def test_small_cnn_training():
    torch.manual_seed(0)
    ref = SmallCNN()
    dev = SmallCNN().to(DEV)
    dev.load_state_dict(ref.state_dict())
    oc = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ot = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)
    torchtpu.reset_metrics()
    for step in range(5):
        x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
        for m, o, xx, yy in ((ref, oc, x, y), (dev, ot, x.to(DEV), y.to(DEV))):
            o.zero_grad()
            loss = F.cross_entropy(m(xx), yy)
            loss.backward()
            o.step()
            if m is ref:
                lc = loss.item()
            else:
                lt = loss.item()
        assert abs(lc - lt) < 1e-3 * max(1.0, abs(lc)), (step, lc, lt)
    for (n, a), (_, b) in zip(dev.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, atol=1e-3, rtol=1e-3, msg=n)
    dev.eval()
    ref.eval()
    x = torch.randn(4, 3, 16, 16)
    torch.testing.assert_close(dev(x.to(DEV)).detach().cpu(), ref(x).detach(), atol=1e-3, rtol=1e-3)
    assert not torchtpu.metrics()["cpu_fallbacks"], torchtpu.metrics()["cpu_fallbacks"]


def test_compiled_conv_norm_pool():
    """torch.compile(backend='tpu') of a conv/norm/pool model matches CPU, running
    stats included. (Some of these graphs still run eagerly: the graph runner
    does not yet take int tensor arguments (num_batches_tracked += 1), non-tensor
    outputs, or arange.start_step from the bilinear decomposition.)"""
    torch.manual_seed(0)

    def make():
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Upsample(scale_factor=2, mode="bilinear"), nn.GroupNorm(2, 4),
                             nn.AdaptiveAvgPool2d(1))

    m, mt = make(), make().to(DEV)
    mt.load_state_dict(m.state_dict())
    cm = torch.compile(mt, backend="tpu")
    x = torch.randn(2, 3, 8, 8)
    torchtpu.reset_metrics()
    for train in (True, False):
        m.train(train)
        mt.train(train)
        e, r = m(x), cm(x.to(DEV))
        torch.testing.assert_close(r.cpu(), e, atol=1e-4, rtol=1e-4)
        if train:
            e.sum().backward()
            r.sum().backward()
            torch.testing.assert_close(mt[0].weight.grad.cpu(), m[0].weight.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mt[1].running_mean.cpu(), m[1].running_mean)
        torch.testing.assert_close(mt[1].running_var.cpu(), m[1].running_var)
    assert not torchtpu.metrics()["cpu_fallbacks"]


def test_conv_transpose_grad_output_padding_ge_stride():
    # output_padding may reach max(stride, dilation) - 1: the input gradient's
    # windows leave an output tail unreached (OpInfo sample, groups=2).
    torch.manual_seed(0)
    check(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(3, 2), padding=(1, 2), output_padding=(2, 3),
                                             groups=2, dilation=4),
          torch.randn(2, 2, 4, 4), torch.randn(2, 2, 4, 5), torch.randn(4))
    check(lambda x, w: F.conv_transpose3d(x, w, stride=(1, 2, 1), output_padding=(1, 2, 0), dilation=(2, 3, 1)),
          torch.randn(1, 2, 3, 3, 3), torch.randn(2, 3, 2, 2, 2))


def test_native_batch_norm_eval_stats_empty_like_cpu():
    # Evaluation mode: save_mean / save_invstd are (0,) on CPU; the meta kernels say (C,).
    torch.manual_seed(0)
    x, w, bias = torch.randn(2, 3, 4), torch.randn(3), torch.randn(3)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    for f in (lambda *a: torch.native_batch_norm(*a, False, 0.1, 1e-5),
              lambda *a: torch._native_batch_norm_legit(*a, False, 0.1, 1e-5),
              lambda *a: torch._native_batch_norm_legit_no_training(*a, 0.1, 1e-5)):
        check(lambda x, w, bias: f(x, w, bias, rm.to(x.device), rv.to(x.device)), x, w, bias)
        e = f(x, w, bias, rm, rv)
        r = f(*(t.to(DEV) for t in (x, w, bias, rm, rv)))
        assert [t.shape for t in r] == [t.shape for t in e]
        assert [t.dtype for t in r] == [t.dtype for t in e]
    # .out in evaluation mode leaves save_mean / save_invstd as they are
    for n in (0, 5):
        outs = [(torch.empty(0, device=d), torch.full((n,), 7.0, device=d), torch.full((n,), 7.0, device=d))
                for d in ("cpu", DEV)]
        for d, (o0, o1, o2) in zip(("cpu", DEV), outs):
            torch.ops.aten.native_batch_norm.out(*(t.to(d) for t in (x, w, bias, rm, rv)), False, 0.1, 1e-5,
                                                 out=o0, save_mean=o1, save_invstd=o2)
        for a, b in zip(outs[1], outs[0]):
            torch.testing.assert_close(a.cpu(), b)
