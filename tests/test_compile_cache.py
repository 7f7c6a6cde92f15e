"""torch.compile(backend="tpu") restarts: AOTAutograd's cache (bundled) under
TORCHTPU_CACHE_DIR skips tracing, the executable cache skips XLA compiles.

Each test runs a cold process and then a warm one on the same cache directory."""
import json
import os

import torch

PROG = r"""
import json, warnings, torch, torch.nn as nn, torchtpu
warnings.simplefilter("ignore")
out = {}


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def train(dev, compiled, steps=2, batch=5):
    m = mlp().to(dev)
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    fwd = torch.compile(m, backend="tpu", dynamic=False) if compiled else m
    opt_step = torch.compile(opt.step, backend="tpu") if compiled else opt.step
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g)
        loss = nn.functional.mse_loss(fwd(x.to(dev)), y.to(dev))
        opt.zero_grad()
        loss.backward()
        grads = [p.grad.cpu().tolist() for p in m.parameters()]
        opt_step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads, "params": [p.detach().cpu().tolist() for p in m.parameters()]}


if CASE == "mlp":
    out["tpu"], out["cpu"] = train("tpu", True), train("cpu", False)
    if NEW_SHAPE:
        out["tpu7"], out["cpu7"] = train("tpu", True, batch=7), train("cpu", False, batch=7)
elif CASE == "mutation":
    def bn_steps(dev, compiled):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU()).to(dev)
        f = torch.compile(m, backend="tpu", dynamic=False) if compiled else m
        g = torch.Generator().manual_seed(2)
        ys = []
        for _ in range(2):
            ys.append(f(torch.randn(4, 6, generator=g).to(dev)).sum().item())
        return {"ys": ys, "buffers": [b.cpu().tolist() for b in m.buffers()]}

    def update(x, buf):  # an input mutation, and a tensor constant of the graph
        buf.mul_(0.5).add_(x * torch.tensor([1.0, 2.0, 3.0], device=x.device))
        return buf.sum()

    def mutated(dev, compiled):
        f = torch.compile(update, backend="tpu", dynamic=False) if compiled else update
        buf = torch.ones(3, device=dev)
        s = [f(torch.full((3,), float(i), device=dev), buf).item() for i in range(3)]
        return {"sums": s, "buf": buf.cpu().tolist()}

    def masked(dev, compiled):  # a lowering rejects it when it first runs: eager after a load too
        f = lambda x, m, v: torch.index_put(x, (m,), v)
        f = torch.compile(f, backend="tpu", dynamic=False) if compiled else f
        x, m, v = torch.arange(25.).view(5, 5), torch.tensor([True, False, True, False, True]), torch.ones(5)
        return f(x.to(dev), m.to(dev), v.to(dev)).cpu().tolist()

    for name, fn in (("bn", bn_steps), ("mut", mutated), ("masked", masked)):
        out[name], out[name + "_cpu"] = fn("tpu", True), fn("cpu", False)
m = torchtpu.metrics()
out["compiles"] = m["compiles"]
out["compile"] = {k: v for k, v in m["compile"].items() if k != "graph_fallback_reasons"}
print(json.dumps(out))
"""


def _run(pyrun, cache_dir, case, new_shape=False, extra_env=None):
    env = {"TORCHTPU_CACHE_DIR": cache_dir, "TORCHTPU_MODE": "strict"}
    env.update(extra_env or {})
    r = pyrun(f"CASE = {case!r}\nNEW_SHAPE = {new_shape}\n" + PROG, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _flat(x):
    if isinstance(x, dict):
        return _flat([x[k] for k in sorted(x)])
    return [v for e in x for v in _flat(e)] if isinstance(x, (list, tuple)) else [x]


def _close(a, b, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(torch.tensor(_flat(a)), torch.tensor(_flat(b)), rtol=rtol, atol=atol)


def _aot_entries(root):
    d = os.path.join(root, "torch", "aotautograd")
    return [f for _, _, fs in os.walk(d) for f in fs]


def test_warm_restart_loads_traced_graphs_and_programs(pyrun, tmp_path):
    """A small MLP trained 2 steps with a compiled model and a compiled Adam step."""
    d = str(tmp_path / "cache")
    cold = _run(pyrun, d, "mlp")
    assert cold["compile"]["aot_cache_misses"] == 2  # model (forward + backward), optimizer step
    assert cold["compile"]["aot_cache_hits"] == 0 and cold["compiles"] > 0
    assert len(_aot_entries(d)) == 2
    warm = _run(pyrun, d, "mlp")
    assert warm["compile"]["aot_cache_hits"] == 2 and warm["compile"]["aot_cache_misses"] == 0
    assert warm["compile"]["graphs_loaded"] == 3 and warm["compile"]["graph_fallbacks"] == 0
    assert warm["compiles"] == 0
    assert warm["tpu"] == cold["tpu"]  # bit-identical: the same programs
    for k in ("losses", "grads", "params"):
        _close(warm["tpu"][k], warm["cpu"][k])


def test_warm_restart_keeps_input_mutations_buffers_and_fallbacks(pyrun, tmp_path):
    d = str(tmp_path / "cache")
    cold = _run(pyrun, d, "mutation")
    warm = _run(pyrun, d, "mutation")
    assert warm["compile"]["aot_cache_hits"] == 3 and warm["compile"]["aot_cache_misses"] == 0
    assert warm["compiles"] == 0
    # the boolean-mask index_put is cached too (a lowering rejects it at run time), and runs eagerly
    assert warm["compile"]["graph_fallbacks"] == cold["compile"]["graph_fallbacks"] == 1
    for k in ("bn", "mut", "masked"):
        assert warm[k] == cold[k]
        _close(warm[k], warm[k + "_cpu"])


def test_empty_cache_dir_writes_nothing_and_works(pyrun, tmp_path):
    inductor_dir = str(tmp_path / "inductor")
    env = {"TORCHINDUCTOR_CACHE_DIR": inductor_dir}
    for _ in range(2):
        r = _run(pyrun, "", "mlp", extra_env=env)
        c = r["compile"]
        assert c["aot_cache_hits"] == c["aot_cache_misses"] == c["aot_cache_bypasses"] == 0
        assert r["compiles"] > 0
        for k in ("losses", "grads", "params"):
            _close(r["tpu"][k], r["cpu"][k])
    assert not os.path.exists(os.path.join(inductor_dir, "aotautograd"))


def test_new_shape_after_a_warm_start_recompiles(pyrun, tmp_path):
    d = str(tmp_path / "cache")
    _run(pyrun, d, "mlp")
    warm = _run(pyrun, d, "mlp", new_shape=True)
    assert warm["compile"]["aot_cache_hits"] >= 2  # the cold graphs (the optimizer step again at batch 7)
    assert warm["compile"]["aot_cache_misses"] == 1  # the model at batch 7
    assert warm["compiles"] > 0
    for k in ("losses", "grads", "params"):
        _close(warm["tpu7"][k], warm["cpu7"][k])
