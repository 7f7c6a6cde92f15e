"""Compiles off the critical path: strict mode queues the launch of a program
still compiling (its results are pending buffers) and goes on dispatching.

Each test runs in a fresh process with an empty compile cache, so the programs
really compile while the host runs ahead; results are compared with CPU and
with the same code run with TORCHTPU_ASYNC_COMPILE=0."""
import json
import tempfile

import pytest

SETUP = r"""
import json, torch, torchtpu
torch.manual_seed(0)
def m(): return torchtpu.metrics()
"""


def _run(pyrun, code, **env):
    env = {"TORCHTPU_CACHE_DIR": tempfile.mkdtemp(prefix="tt-async-"), "TORCHTPU_HOST_TIER": "0", **env}
    p = pyrun(SETUP + code, env=env, timeout=120)
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


CHAIN = r"""
xs = [torch.randn(3 + i, 5) for i in range(12)]
d = [x.to("tpu") for x in xs]
torchtpu.reset_metrics()
outs = []
for i, x in enumerate(d):
    y = (x * (i + 1)).sin() + x.cos()       # new shapes: every op compiles
    x.mul_(2)                               # in place on an input a queued launch reads
    outs.append(y.sum(1))
queued = m()["queued_launches"]
got = [o.cpu() for o in outs] + [x.cpu() for x in d]
want = []
for i, x in enumerate(xs):
    want.append(((x * (i + 1)).sin() + x.cos()).sum(1))
for x in xs:
    want.append(x * 2)
print(json.dumps({"queued": queued, "ok": all(torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want)),
                  "compiles": m()["compiles"], "bits": [a.numpy().tobytes().hex() for a in got]}))
"""


def test_queued_launches_give_cpu_results_and_keep_program_order(pyrun):
    on = _run(pyrun, CHAIN)
    off = _run(pyrun, CHAIN, TORCHTPU_ASYNC_COMPILE="0")
    assert on["queued"] > 0 and off["queued"] == 0
    assert on["ok"] and off["ok"]
    # the same programs (donation decisions are not changed by queued references)
    assert on["compiles"] == off["compiles"]
    assert on["bits"] == off["bits"]


def test_views_and_in_place_writes_over_pending_buffers(pyrun):
    r = _run(pyrun, r"""
a = torch.arange(60.).reshape(6, 10)
t = a.to("tpu")
u = t.exp()                    # pending (compiling)
v = u[1:4, 2:7]                # a view of a pending result
v.add_(1)                      # written through the view while still pending
u[0].zero_()
w = u.t().contiguous() * 3
b = a.exp(); b[1:4, 2:7] += 1; b[0] = 0
print(json.dumps({"ok": torch.allclose(u.cpu(), b, rtol=1e-6) and torch.allclose(w.cpu(), b.t() * 3, rtol=1e-6),
                  "queued": m()["queued_launches"]}))
""")
    assert r["ok"] and r["queued"] > 0


def test_training_steps_match_synchronous_compiles_bit_for_bit(pyrun):
    code = r"""
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
model.to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = []
for step in range(4):
    x = torch.randn(8 + step, 16).to("tpu")   # a new batch size every step
    loss = model(x).square().mean()
    loss.backward()
    opt.step(); opt.zero_grad()
    losses.append(loss)
vals = [l.item() for l in losses]
params = [p.detach().cpu().numpy().tobytes().hex() for p in model.parameters()]
print(json.dumps({"vals": vals, "params": params, "compiles": m()["compiles"], "queued": m()["queued_launches"]}))
"""
    on = _run(pyrun, code)
    off = _run(pyrun, code, TORCHTPU_ASYNC_COMPILE="0")
    assert on["queued"] > 0
    assert on["vals"] == off["vals"] and on["params"] == off["params"]
    assert on["compiles"] == off["compiles"]


def test_a_failing_compile_surfaces_its_message_and_the_process_goes_on(pyrun):
    # every compile fails (an option XLA does not know): the error reaches the
    # reader of the result, or the next synchronize, as a RuntimeError naming it
    r = _run(pyrun, r"""
errs = []
try:
    x = torch.ones(7, 3, device="tpu")
    y = (x + 2).cos()
    y.cpu()
except RuntimeError as e:
    errs.append(str(e))
try:
    torch.tpu.synchronize()
except RuntimeError as e:
    errs.append(str(e))
z = torch.ones(2) * 3    # CPU still works
print(json.dumps({"errs": errs, "z": z.tolist()}))
""", TORCHTPU_XLA_OPTIONS="xla_no_such_option_for_test=true")
    assert r["errs"] and "xla_no_such_option_for_test" in r["errs"][0]
    assert r["z"] == [3.0, 3.0]


def test_exit_with_launches_still_queued_is_clean_and_quick(pyrun):
    import time
    t0 = time.perf_counter()
    r = _run(pyrun, r"""
outs = []
x = torch.randn(5, 5, device="tpu")
for i in range(40):
    x = torch.cat([x, x[:1] * 1.5]).tanh()   # 40 new shapes, never read
print(json.dumps({"queued": m()["queued_launches"]}))
""")
    assert r["queued"] > 0
    assert time.perf_counter() - t0 < 60


def test_synchronize_and_events_wait_for_queued_launches(pyrun):
    r = _run(pyrun, r"""
x = torch.randn(33, 17, device="tpu")
e0 = torch.tpu.Event(enable_timing=True); e0.record()
y = x.exp().log1p().sqrt()
e1 = torch.tpu.Event(enable_timing=True); e1.record()
e1.synchronize()
q1 = torchtpu._C._launches_queued()
z = y.sigmoid() * 2
torch.tpu.synchronize()
q2 = torchtpu._C._launches_queued()
ok = torch.allclose(z.cpu(), x.cpu().exp().log1p().sqrt().sigmoid() * 2)
print(json.dumps({"q1": q1, "q2": q2, "ok": ok, "ms": e0.elapsed_time(e1) >= 0,
                  "stream_done": torch.tpu.current_stream().query()}))
""")
    assert r == {"q1": False, "q2": False, "ok": True, "ms": True, "stream_done": True}


@pytest.mark.parametrize("mode", ["debug", "defer_and_fuse"])
def test_other_modes_agree_with_async_strict(pyrun, mode):
    code = r"""
x = torch.randn(9, 13).to("tpu")
ys = []
for i in range(5):
    x = (x * 1.25 + i).tanh()
    ys.append(x[:, : i + 2].sum())
print(json.dumps([y.item() for y in ys]))
"""
    a = _run(pyrun, code)
    b = _run(pyrun, code, TORCHTPU_MODE=mode)
    assert a == pytest.approx(b, rel=1e-5, abs=1e-5)
