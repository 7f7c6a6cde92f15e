"""torch.compile(backend="tpu"): compiled graphs match eager tpu and CPU."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from torchtpu.compile import lower as _compile
from torchtpu.examples.gpt import GPTConfig, batches, make_model, synthetic_corpus


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _stats():
    return dict(_compile.stats)


def test_backend_is_registered():
    assert "tpu" in torch._dynamo.list_backends()


def test_mlp_forward_backward_matches_cpu():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    ref_x = x.clone().requires_grad_()
    ref = m(ref_x)
    ref.sum().backward()
    mt = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    before = _stats()
    cm = torch.compile(mt, backend="tpu")
    xt = x.to("tpu").requires_grad_()
    out = cm(xt)
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xt.grad.cpu(), ref_x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mt[0].weight.grad.cpu(), m[0].weight.grad, rtol=1e-5, atol=1e-5)
    s = _stats()
    assert s["graphs_compiled"] - before["graphs_compiled"] == 2  # forward + backward
    assert s["graph_fallbacks"] == before["graph_fallbacks"]


def test_saved_weight_views_alias_the_weights_and_backward_matches_cpu(monkeypatch):
    # The forward graph saves t(weight) for the backward: it is made on the host as a view
    # of the weight (as eager and Inductor do), not returned by the program (an XLA copy of
    # the weight per step); the weight's later in-place update is seen by it, as in eager.
    programs = []
    run = _compile._Lowerer.run
    monkeypatch.setattr(_compile._Lowerer, "run", lambda self: programs.append(run(self)) or programs[-1])
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    ref = m(x)
    ref.sum().backward()
    mt = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    mt.load_state_dict(m.state_dict())
    mt = mt.to("tpu")
    for _ in range(2):  # the second call replays the program
        mt.zero_grad()
        out = torch.compile(mt, backend="tpu")(x.to("tpu"))
        out.sum().backward()
        torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
        for a, b in zip(mt.parameters(), m.parameters()):
            torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)
    aliased = [a for p in programs for a in p["alias_outputs"]]
    assert len(aliased) == 1  # t(weight) of the second layer (x needs no gradient: the first's is not saved)
    with torch.no_grad():  # an in-place update of a weight after the forward: eager's version check
        mt[2].weight.add_(1.0)
    out = torch.compile(mt, backend="tpu")(x.to("tpu"))
    with torch.no_grad():
        mt[2].weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_fullgraph_and_programs_are_cached(metrics):
    def f(a, b):
        return torch.relu(a @ b + 1.0).sum(dim=0)

    cf = torch.compile(f, backend="tpu", fullgraph=True)
    a, b = torch.randn(6, 5), torch.randn(5, 3)
    r = cf(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(r.cpu(), f(a, b), rtol=1e-5, atol=1e-5)
    compiles = metrics()["compiles"]
    for _ in range(3):
        cf(a.to("tpu"), b.to("tpu")).cpu()
    assert metrics()["compiles"] == compiles


def test_new_shape_recompiles_and_is_counted():
    def f(x):
        return (x * 2).sin()

    cf = torch.compile(f, backend="tpu", dynamic=False)
    before = _stats()["graphs_compiled"]
    for n in (4, 7):
        x = torch.randn(n)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x))
    assert _stats()["graphs_compiled"] - before == 2


def test_input_mutation_in_graph_is_written_back():
    def f(x, buf):
        buf.add_(x)
        return buf * 2

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(4)
    buf_cpu = torch.ones(4)
    buf = buf_cpu.clone().to("tpu")
    out = cf(x.to("tpu"), buf)
    ref_out = f(x, buf_cpu)
    torch.testing.assert_close(out.cpu(), ref_out)
    torch.testing.assert_close(buf.cpu(), buf_cpu)


def test_graph_break_runs_eagerly_and_matches():
    def f(x):
        y = x * 3
        if y.sum().item() > 0:  # data-dependent control flow: graph break
            return y + 1
        return y - 1

    cf = torch.compile(f, backend="tpu")
    for v in (1.0, -1.0):
        x = torch.full((3,), v)
        torch.testing.assert_close(cf(x.to("tpu")).cpu(), f(x))


def test_dropout_is_reproducible_under_manual_seed():
    def f(x):
        return F.dropout(x, p=0.5, training=True)

    cf = torch.compile(f, backend="tpu")
    x = torch.ones(256, device="tpu")
    torch.manual_seed(123)
    a = cf(x).cpu()
    torch.manual_seed(123)
    b = cf(x).cpu()
    c = cf(x).cpu()
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, c)
    kept = (a != 0).float().mean().item()
    assert 0.35 < kept < 0.65
    assert set(a.unique().tolist()) <= {0.0, 2.0}


def _train(model_fn, compiled, steps, device="tpu"):
    cfg = GPTConfig()
    corpus = synthetic_corpus(4000, cfg.vocab_size)
    model = make_model(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    losses = []
    for x, y in batches(corpus, 8, cfg.block_size, steps):
        loss = fwd(x.to(device), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_gpt_training_compiled_matches_eager_and_cpu():
    cpu = _train(None, False, 4, device="cpu")
    eager = _train(None, False, 4)
    before = _stats()
    comp = _train(None, True, 4)
    for a, b, c in zip(cpu, eager, comp):
        assert abs(a - b) < 1e-4 and abs(a - c) < 1e-4
    s = _stats()
    assert s["graph_fallbacks"] == before["graph_fallbacks"]
    assert s["graphs_compiled"] - before["graphs_compiled"] >= 2


def test_metrics_expose_compile_counters():
    m = torchtpu.metrics()["compile"]
    for k in ("graphs_compiled", "graph_fallbacks", "graph_calls", "graph_breaks"):
        assert k in m


def test_transformer_with_dropout_inference_matches_and_training_is_reproducible():
    cfg = GPTConfig(dropout=0.1)
    model = make_model(cfg).to("tpu")
    x = torch.randint(0, cfg.vocab_size, (4, cfg.block_size))
    y = torch.randint(0, cfg.vocab_size, (4, cfg.block_size))
    cm = torch.compile(model, backend="tpu")
    model.eval()
    with torch.no_grad():
        ref = model(x.to("tpu")).cpu()
        out = cm(x.to("tpu")).cpu()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    cpu_model = make_model(cfg).eval()
    torch.testing.assert_close(out, cpu_model(x).detach(), rtol=1e-4, atol=1e-4)
    model.train()
    losses = []
    for _ in range(2):
        torch.manual_seed(7)
        loss = cm(x.to("tpu"), y.to("tpu"))
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1]
    torch.manual_seed(8)
    assert cm(x.to("tpu"), y.to("tpu")).item() != losses[0]


def test_mark_dynamic_runs_eagerly_with_a_warning():
    def f(x):
        return x.cos() + 1

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(6)
    xt = x.to("tpu")
    torch._dynamo.mark_dynamic(xt, 0)
    before = _stats()["graph_fallbacks"]
    with pytest.warns(UserWarning, match="dynamic shapes"):
        out = cf(xt)
    torch.testing.assert_close(out.cpu(), f(x))
    assert _stats()["graph_fallbacks"] == before + 1


def test_tensor_constant_is_a_graph_input():
    idx = torch.tensor([2, 0])

    def f(x):
        return x[idx] * 2

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=False)
    x = torch.randn(4, 3)
    before = _stats()
    out = cf(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x))
    s = _stats()
    assert s["graph_fallbacks"] == before["graph_fallbacks"]
    assert s["graph_calls"] > before["graph_calls"]


def test_graph_a_lowering_rejects_runs_eagerly_with_a_warning():
    def f(x, m, v):
        return torch.index_put(x, (m,), v)

    torch._dynamo.reset()
    cf = torch.compile(f, backend="tpu", dynamic=False)
    x, m, v = torch.randn(5, 5), torch.tensor([True, False, True, False, True]), torch.randn(5)
    before = _stats()["graph_fallbacks"]
    with pytest.warns(UserWarning, match="boolean mask"):
        out = cf(x.to("tpu"), m.to("tpu"), v.to("tpu"))
    torch.testing.assert_close(out.cpu(), f(x, m, v))
    assert _stats()["graph_fallbacks"] == before + 1
    out = cf(x.to("tpu"), m.to("tpu"), v.to("tpu"))  # stays eager, no second fallback count
    torch.testing.assert_close(out.cpu(), f(x, m, v))
    assert _stats()["graph_fallbacks"] == before + 1


def test_repeated_calls_replay_the_lowered_graph_with_new_values():
    def f(x, buf):
        buf.mul_(0.5).add_(x)
        return torch.tanh(buf @ x.T).sum(1)

    cf = torch.compile(f, backend="tpu", fullgraph=True)
    buf_cpu = torch.randn(3, 4)
    buf = buf_cpu.to("tpu")
    before = _compile.metrics()
    for step in range(5):
        x = torch.randn(3, 4)
        held = buf if step == 2 else None  # an extra reference must not change the result
        out = cf(x.to("tpu"), buf)
        ref = f(x, buf_cpu)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(buf.cpu(), buf_cpu, rtol=1e-5, atol=1e-5)
        del held
    after = _compile.metrics()
    assert after["graph_replays"] - before["graph_replays"] >= 3
    assert after["graph_lowerings"] - before["graph_lowerings"] <= 2


def test_replay_respects_input_views_and_storage_sharing():
    def f(a, b):
        return a * 2 + b

    cf = torch.compile(f, backend="tpu", dynamic=False)
    base = torch.randn(4, 6).to("tpu")
    # same shapes, different views: contiguous, a transposed slice, and an input aliasing the other
    cases = [(base[:, :4], base[:, 2:]), (base[:, 1:5], base[:, :4]), (base[:, :4], base[:, :4])]
    for a, b in cases:
        for _ in range(2):
            a_cpu, b_cpu = a.cpu(), b.cpu()
            torch.testing.assert_close(cf(a, b).cpu(), f(a_cpu, b_cpu))


def test_replayed_dropout_draws_new_masks_and_is_reproducible():
    def f(x):
        return F.dropout(x, p=0.5, training=True)

    cf = torch.compile(f, backend="tpu")
    x = torch.ones(64, 64, device="tpu")

    def run():
        torch.manual_seed(7)
        return [cf(x).cpu() for _ in range(3)]

    first, second = run(), run()
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD])
def test_compiled_optimizer_step_matches_cpu(opt_cls):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    model.load_state_dict(ref.state_dict())
    model.to("tpu")
    kw = {"lr": 0.01, "momentum": 0.9} if opt_cls is torch.optim.SGD else {"lr": 0.01}
    ref_opt, opt = opt_cls(ref.parameters(), **kw), opt_cls(model.parameters(), **kw)
    step = torch.compile(opt.step, backend="tpu")
    before = _stats()["graph_fallbacks"]
    for i in range(4):
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        for m, o, xs, ys, st in ((ref, ref_opt, x, y, ref_opt.step), (model, opt, x.to("tpu"), y.to("tpu"), step)):
            o.zero_grad(set_to_none=True)
            F.mse_loss(m(xs), ys).backward()
            st()
    for p_ref, p in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_ref, rtol=1e-4, atol=1e-5)
    if opt_cls is not torch.optim.SGD:
        # the CPU step counts are updated on the host, not copied back from the device
        steps = [s["step"] for s in opt.state.values()]
        assert all(float(s) == 4.0 for s in steps)
    assert _stats()["graph_fallbacks"] == before


def test_import_does_not_load_dynamo_and_backend_registers_on_demand(pyrun):
    """Importing torchtpu leaves torch._dynamo (about a second) unimported;
    torch.compile(backend="tpu") still finds the backend, in either import order."""
    code = (
        "import sys, torch, torchtpu\n"
        "assert 'torch._dynamo' not in sys.modules, 'torchtpu imported Dynamo'\n"
        "f = torch.compile(lambda x: (x * 2).sin(), backend='tpu')\n"
        "x = torch.arange(4.0)\n"
        "torch.testing.assert_close(f(x.to('tpu')).cpu(), (x * 2).sin())\n"
        "assert torchtpu.metrics()['compile']['graphs_compiled'] >= 1\n"
    )
    code_dynamo_first = (
        "import torch, torch._dynamo, torchtpu\n"
        "f = torch.compile(lambda x: x + 1, backend='tpu')\n"
        "assert f(torch.ones(2, device='tpu')).cpu().tolist() == [2.0, 2.0]\n"
    )
    for c in (code, code_dynamo_first):
        r = pyrun(c, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]


def test_fused_optimizer_op_in_a_graph_matches_cpu():
    # functionalized _fused_adamw_ returns a tuple of Tensor[]: one graph program
    def step(ps, gs, m1, m2, mx, steps):
        torch._fused_adamw_(ps, gs, m1, m2, mx, steps, lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1,
                            eps=1e-8, amsgrad=True, maximize=False)
        return ps[0] * 1

    torch.manual_seed(0)
    shapes = [(3, 4), (5,)]
    state = [[torch.randn(s) for s in shapes] for _ in range(2)] + [[torch.rand(s) for s in shapes]
                                                                   for _ in range(3)]
    state.append([torch.tensor(2.0) for _ in shapes])
    res = []
    g0 = torchtpu.metrics()["compile"]["graphs_compiled"]
    for dev, fn in (("cpu", step), ("tpu", torch.compile(step, backend="tpu", fullgraph=True))):
        lists = [[t.clone().to(dev) for t in l] for l in state]
        fn(*lists)
        res.append([t.cpu() for l in lists[:5] for t in l])
    assert torchtpu.metrics()["compile"]["graphs_compiled"] == g0 + 1
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
