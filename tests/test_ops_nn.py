"""Native lowerings of reductions, NN ops, indexing and shape ops: tpu vs CPU
(forward and backward), with no CPU fallbacks."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchtpu

warnings.filterwarnings("ignore", message=".*native tpu lowering.*")
DEV = "tpu"


from optest import _to, check  # noqa: E402,F401


torch.manual_seed(0)
X = torch.randn(4, 5, 3)
XNAN = X.clone()
XNAN[1, 2, 0] = float("nan")
XI = torch.randint(-5, 5, (4, 5))

REDUCTIONS = {
    "sum": lambda d, t: t.sum(),
    "sum_dims_keep": lambda d, t: t.sum((0, 2), keepdim=True),
    "sum_dtype": lambda d, t: t.sum(1, dtype=torch.float64),
    "mean": lambda d, t: t.mean(),
    "mean_dim": lambda d, t: t.mean(-1),
    "amax": lambda d, t: t.amax(1),
    "amin_keep": lambda d, t: t.amin((0, 1), keepdim=True),
    "max": lambda d, t: t.max(),
    "max_dim": lambda d, t: t.max(1),
    "min_dim_keep": lambda d, t: t.min(2, keepdim=True),
    "argmax": lambda d, t: t.argmax(),
    "argmin_dim": lambda d, t: t.argmin(1),
    "prod": lambda d, t: t.prod(1),
    "var": lambda d, t: t.var(1),
    "std": lambda d, t: t.std(),
    "var_corr0": lambda d, t: torch.var(t, (0, 1), correction=0, keepdim=True),
    "logsumexp": lambda d, t: t.logsumexp(1),
    "cumsum": lambda d, t: t.cumsum(1),
    "cumprod": lambda d, t: t.cumprod(0),
    "norm": lambda d, t: t.norm(),
    "norm_p1": lambda d, t: t.norm(p=1, dim=1),
    "vnorm_inf": lambda d, t: torch.linalg.vector_norm(t, float("inf"), dim=(0, 2)),
    "vnorm_3": lambda d, t: torch.linalg.vector_norm(t, 3),
}
NO_GRAD = {"argmax", "argmin_dim"}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_float(name):
    check(REDUCTIONS[name], X, grad=name not in NO_GRAD)


@pytest.mark.parametrize("name", ["sum", "amax", "max", "max_dim", "min_dim_keep", "argmax", "logsumexp",
                                  "var", "vnorm_inf"])
def test_reduction_nan_propagates(name):
    check(REDUCTIONS[name], XNAN, grad=False)


INT_REDUCTIONS = {
    "sum": lambda d, t: t.sum(),
    "sum_dim": lambda d, t: t.sum(0),
    "amax": lambda d, t: t.amax(1),
    "max_dim": lambda d, t: t.max(1),
    "argmax": lambda d, t: t.argmax(1),
    "prod": lambda d, t: t.prod(1),
    "cumsum": lambda d, t: t.cumsum(1),
    "all": lambda d, t: t.all(),
    "any_dim": lambda d, t: (t > 0).any(1),
    "all_keep": lambda d, t: t.bool().all(0, keepdim=True),
    "bool_sum": lambda d, t: (t > 0).sum(1),
    "zero_d_sum": lambda d, t: t[0, 0].sum(),
    "zero_d_max": lambda d, t: t[0, 0].max(0),
    "zero_d_amax": lambda d, t: t[0, 0].amax(),
}


@pytest.mark.parametrize("name", sorted(INT_REDUCTIONS))
def test_reduction_int_bool(name):
    check(INT_REDUCTIONS[name], XI, grad=False)


@pytest.mark.parametrize("name", ["sum", "mean_dim", "amax", "logsumexp"])
def test_reduction_bf16(name):
    check(REDUCTIONS[name], X.bfloat16(), grad=False, atol=2e-2, rtol=2e-2)


def test_reduction_bad_dim_raises_like_cpu():
    with pytest.raises(IndexError):
        X.sum(5)
    with pytest.raises(IndexError):
        X.to(DEV).sum(5)


X2 = torch.randn(4, 6)
TG = torch.tensor([0, 5, 2, 3])
NN = {
    "softmax": (lambda d, t: t.softmax(1), (X2,)),
    "log_softmax": (lambda d, t: t.log_softmax(0), (X2,)),
    "layer_norm_affine": (lambda d, t, w, b: F.layer_norm(t, (6,), w, b), (X2, torch.randn(6), torch.randn(6))),
    "layer_norm_2d": (lambda d, t: F.layer_norm(t, (4, 6)), (X2,)),
    "layer_norm_w": (lambda d, t, w: F.layer_norm(t, (6,), w), (X2.view(2, 2, 6), torch.randn(6))),
    "gelu": (lambda d, t: F.gelu(t), (X2,)),
    "gelu_tanh": (lambda d, t: F.gelu(t, approximate="tanh"), (X2,)),
    "silu": (lambda d, t: F.silu(t), (X2,)),
    "relu": (lambda d, t: F.relu(t), (X2,)),
    "sigmoid": (lambda d, t: torch.sigmoid(t), (X2,)),
    "tanh": (lambda d, t: torch.tanh(t), (X2,)),
    "cross_entropy": (lambda d, t: F.cross_entropy(t, TG.to(d)), (X2,)),
    "nll_1d": (lambda d, t: F.nll_loss(t, torch.tensor(3, device=d)), (torch.randn(6),)),
    "nll2d": (lambda d, t: F.nll_loss(t, torch.tensor([[0, 1], [2, 1]], device=d).view(2, 2, 1).expand(2, 2, 3),
                                      ignore_index=1), (torch.randn(2, 3, 2, 3),)),
    "nll2d_none": (lambda d, t: F.nll_loss(t, torch.tensor([[0, 1], [2, 1]], device=d).view(2, 2, 1).expand(2, 2, 3),
                                           reduction="none"), (torch.randn(2, 3, 2, 3),)),
    "embedding": (lambda d, w: F.embedding(torch.tensor([[0, 2], [2, 4]], device=d), w), (torch.randn(5, 3),)),
    "embedding_pad": (lambda d, w: F.embedding(torch.tensor([[0, 2], [2, 4]], device=d), w, padding_idx=2),
                      (torch.randn(5, 3),)),
    "embedding_scale": (lambda d, w: F.embedding(torch.tensor([[0, 2], [2, 4]], device=d), w,
                                                 scale_grad_by_freq=True), (torch.randn(5, 3),)),
}


@pytest.mark.parametrize("name", sorted(NN))
def test_nn(name):
    fn, inputs = NN[name]
    check(fn, *inputs)


@pytest.mark.parametrize("red", ["none", "mean", "sum"])
def test_nll_weight_ignore_index(red):
    w = torch.rand(6)
    check(lambda d, t: F.nll_loss(t.log_softmax(1), TG.to(d), weight=w.to(d), reduction=red, ignore_index=2), X2)


@pytest.mark.parametrize("red", ["none", "mean", "sum"])
def test_mse_loss(red):
    check(lambda d, a, b: F.mse_loss(a, b, reduction=red), X2, torch.randn(4, 6))


def test_softmax_bf16():
    check(lambda d, t: t.softmax(1), X2.bfloat16(), atol=2e-2, rtol=2e-2)


def test_nll_bad_target_shape_raises_like_cpu():
    for d in ("cpu", DEV):
        with pytest.raises(RuntimeError):
            torch.ops.aten.nll_loss_forward(X2.to(d), torch.tensor([0, 1], device=d), None, 1, -100)


def _setitem(d, t, v, acc, *ix):
    t = t.clone()
    ix = tuple(i.to(d) if i is not None else slice(None) for i in ix)
    if acc:
        t[ix] += v
    else:
        t[ix] = v
    return t


GI = torch.randint(0, 5, (4, 2, 3))
INDEX = {
    "index_select": (lambda d, t: t.index_select(1, torch.tensor([0, 4, 2, 2], device=d)), (X,)),
    "index_select_0d": (lambda d, t: t.index_select(0, torch.tensor(2, device=d)), (X,)),
    "gather": (lambda d, t: t.gather(1, GI.to(d)), (X,)),
    "scatter_add": (lambda d, t, s: t.scatter_add(0, GI[:, :, :1].clamp(max=3).to(d), s), (X, torch.randn(4, 2, 1))),
    "index_add": (lambda d, t, s: t.index_add(1, torch.tensor([0, 0, 4], device=d), s, alpha=2),
                  (X, torch.randn(4, 3, 3))),
    "index_1": (lambda d, t: t[torch.tensor([0, -1, 2, 2], device=d)], (X,)),
    "index_mid": (lambda d, t: t[:, torch.tensor([[1, 2], [0, 4]], device=d)], (X,)),
    "index_split": (lambda d, t: t[torch.tensor([1, 2], device=d), :, torch.tensor([0, 2], device=d)], (X,)),
    "index_bcast": (lambda d, t: t[:, torch.tensor([1, 2], device=d), torch.tensor([[0], [2]], device=d)], (X,)),
    "index_put": (lambda d, t, v: _setitem(d, t, v, False, torch.tensor([0, 2])), (X, torch.randn(2, 5, 3))),
    "index_put_acc": (lambda d, t, v: _setitem(d, t, v, True, torch.tensor([0, 2, 0])), (X, torch.randn(3, 5, 3))),
    "index_put_mid": (lambda d, t, v: _setitem(d, t, v, False, None, torch.tensor([0, 2, 1])), (X, torch.randn(3))),
    "index_put_split": (lambda d, t, v: _setitem(d, t, v, False, torch.tensor([1, 3]), None, torch.tensor([0, 2])),
                        (X, torch.randn(2, 5))),
    "setitem_mask_scalar": (lambda d, t: (lambda u: (u.__setitem__(u > 0, 0.0), u)[1])(t.clone()), (X,)),
    "masked_fill": (lambda d, t: t.masked_fill(t > 0, 2.0), (X,)),
    "masked_fill_tensor": (lambda d, t: t.masked_fill(t > 0, torch.tensor(2.0, device=d)), (X,)),
    "masked_fill_bcast": (lambda d, t: t.masked_fill(t[:, :1] > 0, -1.0), (X,)),
}


@pytest.mark.parametrize("name", sorted(INDEX))
def test_index(name):
    fn, inputs = INDEX[name]
    check(fn, *inputs)


def test_scatter_src_and_value():
    idx = torch.tensor([[[0, 1, 2]], [[3, 4, 0]]]).expand(2, 2, 3)
    check(lambda d, t, s: t.scatter(1, idx.to(d), s), X[:2], torch.randn(2, 2, 3), grad=False)
    check(lambda d, t: t.scatter(2, torch.tensor([[[0], [2]]], device=d), 7.0), X, grad=False)


def test_index_int_tensor():
    check(lambda d, t: t[torch.tensor([1, 2], device=d)], torch.randint(0, 9, (4, 3)), grad=False)


def test_bool_mask_index_only_nonzero_falls_back():
    # data-dependent shape: the mask becomes indices via nonzero (host), the rest is native
    check(lambda d, t: t[t > 0], X, allowed=("aten::nonzero",))
    check(lambda d, t, v: _setitem(d, t, v, False, torch.tensor([True, False, True, False])),
          X, torch.randn(2, 5, 3), allowed=("aten::nonzero",))


SHAPE = {
    "cat": (lambda d, a, b: torch.cat([a, b], 1), (X, torch.randn(4, 2, 3))),
    "cat_legacy_empty": (lambda d, a: torch.cat([a, torch.tensor([], device=d)], 0), (X,)),
    "stack": (lambda d, a, b: torch.stack([a, b], 2), (X, torch.randn(4, 5, 3))),
    "tril": (lambda d, a: a.tril(1), (X,)),
    "triu": (lambda d, a: a.triu(-1), (X,)),
    "flip": (lambda d, a: a.flip(0, 2), (X,)),
    "roll": (lambda d, a: a.roll((1, -2), (0, 1)), (X,)),
    "roll_flat": (lambda d, a: a.roll(3), (X,)),
    "repeat": (lambda d, a: a.repeat(2, 1, 1, 3), (X,)),
    "pad": (lambda d, a: F.pad(a, (1, 2, 0, -1), value=1.5), (X,)),
}


@pytest.mark.parametrize("name", sorted(SHAPE))
def test_shape(name):
    fn, inputs = SHAPE[name]
    check(fn, *inputs)


def test_shape_int():
    check(lambda d, a, b: torch.cat([a, b], -1), torch.randint(0, 5, (2, 3)), torch.randint(0, 5, (2, 2)), grad=False)
    check(lambda d, a: F.pad(a, (1, 1)), torch.randint(0, 5, (2, 3)), grad=False)


@pytest.mark.parametrize("args,dtype", [((5,), None), ((1, 10, 3), None), ((0.5, 2.5, 0.25), None),
                                        ((10, 0, -3), None), ((0, 1, 0.1), torch.bfloat16)])
def test_arange(args, dtype):
    check(lambda d: torch.arange(*args, dtype=dtype, device=d), grad=False)


class Block(torch.nn.Module):
    def __init__(self, dim=16, vocab=11, heads=2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.ln1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, vocab)
        self.heads = heads

    def forward(self, tok):
        x = self.emb(tok)
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        q, k, v = (z.view(B, T, self.heads, C // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / (C // self.heads) ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool, device=tok.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def test_transformer_block_end_to_end():
    torch.manual_seed(0)
    m = Block()
    mt = Block().to(DEV)
    mt.load_state_dict(m.state_dict())
    tok = torch.randint(0, 11, (2, 7))
    tgt = torch.randint(0, 11, (2, 7))
    torchtpu.reset_metrics()
    loss = F.cross_entropy(m(tok).flatten(0, 1), tgt.flatten())
    loss.backward()
    lt = F.cross_entropy(mt(tok.to(DEV)).flatten(0, 1), tgt.to(DEV).flatten())
    lt.backward()
    torch.testing.assert_close(lt.cpu(), loss, atol=1e-4, rtol=1e-4)
    for (n, p), pt in zip(m.named_parameters(), mt.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), p.grad, atol=1e-4, rtol=1e-4, msg=n)
    assert not torchtpu.metrics()["cpu_fallbacks"], torchtpu.metrics()["cpu_fallbacks"]


# nn.LSTM / nn.GRU run PyTorch's fused cells on PrivateUse1 devices (as on CUDA)
@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU])
@pytest.mark.parametrize("kw", [dict(num_layers=2, bidirectional=True, batch_first=True), dict(bias=False)])
def test_rnn_matches_cpu(cls, kw):
    torch.manual_seed(0)
    ref = cls(6, 5, **kw)
    x = torch.randn(3, 4, 6)
    f0 = dict(torchtpu.metrics()["cpu_fallbacks"])
    res = []
    for dev in ("cpu", "tpu"):
        m = copy.deepcopy(ref).to(dev)
        xx = x.clone().to(dev).requires_grad_()
        out, _ = m(xx)
        (out * out).sum().backward()
        res.append([out.detach().cpu(), xx.grad.cpu()] + [p.grad.cpu() for p in m.parameters()])
    assert dict(torchtpu.metrics()["cpu_fallbacks"]) == f0
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=(2, 3), dilation=(2, 1), padding=1, stride=(2, 1)),
                                dict(kernel_size=2, stride=2)])
@pytest.mark.parametrize("batched", [True, False])
def test_unfold_fold_match_cpu(kw, batched):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 6) if batched else torch.randn(3, 7, 6)
    f0 = dict(torchtpu.metrics()["cpu_fallbacks"])
    res = []
    for dev in ("cpu", "tpu"):
        xx = x.clone().to(dev).requires_grad_()
        cols = F.unfold(xx, **kw)
        back = F.fold(cols * 1.5, (7, 6), **kw)
        (cols.square().sum() + back.sum()).backward()
        res.append([cols.detach().cpu(), back.detach().cpu(), xx.grad.cpu()])
    assert dict(torchtpu.metrics()["cpu_fallbacks"]) == f0
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
