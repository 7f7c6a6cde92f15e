"""The compiled GPT training step vs the same model compiled by JAX, on XLA:CPU.

    python benchmarks/bench_jax.py [--steps 30] [--batches 16,2] [--json out.json]

Needs jax and jaxlib (`pip install torchtpu[bench]`); without them it says so
and measures only the torch configurations.

* "jax": a hand port of torchtpu/examples/gpt.py (same config, shapes,
  dtypes, parameter layouts, loss, dropout setting) with torch's AdamW
  (lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 on every
  parameter), one jax.jit program per step with the parameters and optimizer
  state donated, on JAX's CPU backend (JAX_PLATFORMS=cpu). Its initial
  parameters are the torch model's (copied through numpy), so the first
  step's losses must agree; the script checks that the losses of the first
  steps stay close.
* "tpu_compiled": the step as bench_compile.py builds its fully compiled one
  (torch.compile(backend="tpu") for the model and for the optimizer step).
* "tpu_strict": strict eager tpu; "cpu_inductor": torch.compile (Inductor) of
  the model and the optimizer step on CPU tensors; "cpu_eager".

All configurations run in one process per batch size, taking turns step by
step (this machine's speed drifts over minutes; interleaved, the drift hits
all alike); each reports the median step time after warm-up. The headline
ratio is jax_ms / tpu_compiled_ms (our throughput relative to JAX's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_compile import _script  # noqa: E402

# The JAX port, importable on its own (the HLO comparison in docs/design.md
# uses it too).
JAX_GPT = r'''
import math
import numpy as np
import jax
import jax.numpy as jnp

LR, B1, B2, EPS, WD = 3e-4, 0.9, 0.999, 1e-8, 0.01


def params_from_torch(model):
    """The torch model's parameters as a pytree of jnp arrays, same names and layouts
    (Linear weights [out, in])."""
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}


def _linear(p, name, x, bias=True):
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if bias else y


def _layer_norm(p, name, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def forward(p, idx, cfg):
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    x = p["wte.weight"][idx] + p["wpe.weight"][jnp.arange(T)]   # dropout(0.0): identity
    mask = jnp.tril(jnp.ones((T, T), bool))
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        h = _layer_norm(p, b + "ln1", x)
        q, k, v = jnp.split(_linear(p, b + "attn.qkv", h), 3, axis=2)
        q, k, v = (t.reshape(B, T, H, C // H).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // H))
        s = jnp.where(mask, s, -jnp.inf)
        y = jax.nn.softmax(s, axis=-1) @ v
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + _linear(p, b + "attn.proj", y)
        h = jax.nn.gelu(_linear(p, b + "fc", _layer_norm(p, b + "ln2", x)), approximate=False)
        x = x + _linear(p, b + "out", h)
    return _linear(p, "head", _layer_norm(p, "ln_f", x), bias=False)


def loss_fn(p, idx, targets, cfg):
    logits = forward(p, idx, cfg)
    logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
    return -jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1).mean()


def init_opt(p):
    z = jax.tree.map(jnp.zeros_like, p)
    return {"step": jnp.zeros((), jnp.float32), "m": z, "v": jax.tree.map(jnp.zeros_like, p)}


def adamw(p, g, s):
    """torch.optim.AdamW (decoupled weight decay, bias corrections as torch computes them)."""
    t = s["step"] + 1
    bc1 = 1 - B1 ** t
    bc2 = 1 - B2 ** t
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, s["m"], g)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, s["v"], g)
    p = jax.tree.map(lambda p, m, v: p * (1 - LR * WD) - (LR / bc1) * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + EPS),
                     p, m, v)
    return p, {"step": t, "m": m, "v": v}


def make_step(cfg):
    def step(p, s, idx, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, targets, cfg)
        p, s = adamw(p, g, s)
        return p, s, loss
    return jax.jit(step, donate_argnums=(0, 1))
'''

INTERLEAVED = r"""
import time, json, statistics, types
import numpy as np
import torch, torchtpu
from torchtpu.examples.gpt import GPTConfig, batches, make_model, make_train_step, synthetic_corpus
cfg = GPTConfig()
corpus = synthetic_corpus(4000, cfg.vocab_size)
data = list(batches(corpus, BATCH, cfg.block_size, STEPS))
base = make_model(cfg)
try:
    import jax
    from jax._src import xla_bridge
    # the control: JAX's program compiled and run by the PJRT plugin torchtpu uses (same XLA
    # version and CPU pipeline); "cpu" (jaxlib's own XLA) stays JAX's default backend
    from torchtpu import _plugin
    if _plugin.resolve()[0] == "cpu":
        xla_bridge.register_plugin("xla_cpu_pjrt", library_path=_plugin.resolve()[1], priority=-100)
        jax.config.update("jax_platforms", "cpu,xla_cpu_pjrt")
    import jax.numpy as jnp
    jg = types.ModuleType("jax_gpt")
    exec(JAX_GPT, jg.__dict__)
except ImportError as e:
    jax = None
    jax_skip = f"jax not importable ({e}): pip install 'torchtpu[bench]'"
configs = {}
losses = {}
for name, dev, compiled in (("cpu_eager", "cpu", ""), ("cpu_inductor", "cpu", "inductor"),
                            ("tpu_strict", "tpu", ""), ("tpu_compiled", "tpu", "full")):
    model = make_model(cfg).to(dev)
    model.load_state_dict(base.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    if compiled == "inductor":
        fwd, opt_step = torch.compile(model), torch.compile(opt.step)
        def step(x, y, fwd=fwd, opt=opt, opt_step=opt_step):
            loss = fwd(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt_step()
            return loss
    else:
        step = make_train_step(model, opt, compile=compiled == "full")
    batches_dev = [(x.to(dev), y.to(dev)) for x, y in data]
    def run(x, y, step=step):
        return step(x, y).item()
    configs[name] = dict(run=run, data=batches_dev)
if jax is not None:
    platforms = [("jax", "cpu")]
    try:
        platforms.append(("jax_plugin", jax.devices("xla_cpu_pjrt")[0]))
    except RuntimeError:
        pass
    for name, dev in platforms:
        dev = jax.devices(dev)[0] if isinstance(dev, str) else dev
        state = {"p": jax.device_put(jg.params_from_torch(base), dev)}
        state["s"] = jax.device_put(jg.init_opt(state["p"]), dev)
        def run_jax(x, y, state=state, jstep=jg.make_step(cfg)):
            state["p"], state["s"], loss = jstep(state["p"], state["s"], x, y)
            return float(loss)
        configs[name] = dict(run=run_jax, data=[(jax.device_put(x.numpy(), dev), jax.device_put(y.numpy(), dev))
                                                for x, y in data])
for c in configs.values():
    c.update(times=[], losses=[])
for i in range(STEPS):
    for name, c in configs.items():
        x, y = c["data"][i]
        # a pause, so that one runtime's spinning worker threads (OpenMP, Eigen) have gone
        # to sleep before the next one's step starts on this 2-core machine
        time.sleep(0.02)
        t0 = time.perf_counter()
        loss = c["run"](x, y)
        c["times"].append(time.perf_counter() - t0)
        c["losses"].append(loss)
k = max(3, STEPS // 3)
res = {name: {"median_step_ms": 1000 * statistics.median(c["times"][k:]),
              "first_losses": c["losses"][:3], "last_loss": c["losses"][-1]} for name, c in configs.items()}
if jax is None:
    res["jax_skipped"] = jax_skip
else:
    res["jax_backend"] = jax.default_backend() + " " + jax.__version__ + " (jax_plugin: " + (
        "the torchtpu PJRT plugin)" if "jax_plugin" in configs else "not loaded)")
print(json.dumps(res))
"""


def step_ratios(batch: int, steps: int) -> dict:
    # bench_compile's runner (a fresh process, strict mode, this tree); JAX on its CPU backend
    os.environ["JAX_PLATFORMS"] = "cpu"
    with tempfile.TemporaryDirectory() as cache_dir:
        res = _script(f"STEPS={steps}\nBATCH={batch}\nJAX_GPT={JAX_GPT!r}\n" + INTERLEAVED, cache_dir)
    c = res["tpu_compiled"]["median_step_ms"]
    ratios = {"compiled_speedup_vs_strict": res["tpu_strict"]["median_step_ms"] / c,
              "compiled_speedup_vs_cpu_inductor": res["cpu_inductor"]["median_step_ms"] / c,
              "compiled_speedup_vs_cpu_eager": res["cpu_eager"]["median_step_ms"] / c}
    if "jax" in res:
        # our throughput relative to JAX's: >= 1 means we are at least as fast
        ratios["jax_ms_over_ours_ms"] = res["jax"]["median_step_ms"] / c
        if "jax_plugin" in res:
            ratios["jax_plugin_ms_over_ours_ms"] = res["jax_plugin"]["median_step_ms"] / c
        # the same parameters and batches: the losses must agree (float rounding apart)
        ref = res["cpu_eager"]["first_losses"]
        ratios["jax_first_losses_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in
                                                      zip(res["jax"]["first_losses"], ref))
    res["ratios"] = ratios
    return res


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batches", default="16,2",
                    help="batch sizes; 16 is bound by XLA:CPU compute, 2 by host dispatch (as on an accelerator)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        import jax  # noqa: F401
    except ImportError as e:
        print(f"bench_jax: jax is not importable ({e}); measuring the torch configurations only "
              "(pip install 'torchtpu[bench]' for the JAX comparison)", file=sys.stderr)
    res = {f"batch_{b}": step_ratios(b, args.steps) for b in (int(v) for v in args.batches.split(","))}
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
