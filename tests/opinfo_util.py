"""OpInfo harness: runs PyTorch's OpInfo sample inputs on "tpu" and compares with CPU.

Used by tests/test_opinfo.py (pytest) and tools/opinfo_sweep.py (full sweep).

For one OpInfo entry, one dtype and one sample, ``run_sample`` checks up to four
variants and returns one record per variant:

  * ``fn``       the functional form ``op(input, *args, **kwargs)``
  * ``inplace``  ``op.inplace_variant`` (skipped when the CPU in-place call raises)
  * ``out``      ``op(..., out=...)`` when ``op.supports_out``
  * ``grad``     ``torch.autograd.grad`` of the sum of the floating outputs w.r.t. every
                 input that requires grad (``op.supports_autograd``, float32 only)
  * ``compiled`` the functional form wrapped in ``torch.compile(fn, backend="tpu",
                 dynamic=False)`` (not in the default ``VARIANTS``; ``run_op`` calls
                 ``torch._dynamo.reset()`` per op when it is requested)

A record is ``{"variant", "status", "native", "fallbacks", "msg"}`` where status is
  * ``pass``   tpu matches CPU (values, dtype, shape), or both raised the same exception type
  * ``fail``   tpu ran but the result differs (or CPU raised and tpu did not / raised another type)
  * ``error``  tpu raised where CPU did not
  * ``skip``   the variant does not apply to this sample
``native`` is True when the tpu call did not use the CPU fallback (``torchtpu.metrics()
["cpu_fallbacks"]`` is empty after the call): "matches CPU" through the fallback is not native.
For ``compiled``, native also needs every captured graph to be lowered into one StableHLO
program (``torchtpu.compile.lower.stats["graph_fallbacks"]`` unchanged, at least one graph run,
no Dynamo graph break); a graph run eagerly is listed in ``fallbacks`` as
``graph:<reason>`` (``graph_break:<reason>``, ``graph:no graph``).
"""
from __future__ import annotations

import contextlib
import functools
import io
import math
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torchtpu

DEVICE = "tpu"

# Per-dtype (rtol, atol). float32/64 are a little looser than assert_close's defaults
# (1.3e-6 / 1e-5): XLA's transcendental approximations and reduction orders differ from
# ATen's by a few ulps. Half types use assert_close's defaults, slightly widened.
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.complex64: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}
# Ops whose numerics legitimately drift more (accumulation over many terms, iterative
# algorithms): (rtol, atol) for float32.
LOOSE_OPS = {
    "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "mv", "dot", "vdot", "inner",
    "outer", "einsum", "tensordot", "linalg.", "cdist", "pdist", "nn.functional.conv", "nn.functional.linear",
    "nn.functional.bilinear", "cumprod", "prod", "logcumsumexp", "var", "std", "nn.functional.batch_norm",
    "nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.instance_norm", "kron",
    "chain_matmul", "trapz", "trapezoid", "cumulative_trapezoid", "polygamma", "mvlgamma", "special.",
}

# Creation ops whose values are unspecified (never compared by value).
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                 "empty_permuted", "nn.functional.dropout", "nn.functional.dropout2d",
                 "nn.functional.dropout3d", "nn.functional.alpha_dropout",
                 "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
                 # samples with training=True apply dropout (random)
                 "nn.functional.multi_head_attention_forward"}


def op_key(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def all_ops():
    """Every OpInfo entry (op_db already includes the linalg/fft/special/signal databases)."""
    from torch.testing._internal.common_methods_invocations import op_db

    seen, out = set(), []
    for op in op_db:
        k = op_key(op)
        if k not in seen:
            seen.add(k)
            out.append(op)
    return out


@functools.cache
def ops_by_key():
    """op key -> OpInfo entry (built once; callers must not change it)."""
    return {op_key(op): op for op in all_ops()}


def _aten_packet(op):
    name = op.aten_name or op.name
    name = name.split(".")[-1]
    return getattr(torch.ops.aten, name, None)


def is_nondeterministic(op) -> bool:
    """Random / uninitialized ops: compared by shape and dtype only."""
    if op.name in UNINITIALIZED or op_key(op) in UNINITIALIZED:
        return True
    if op.name.startswith(("empty", "rand", "normal", "bernoulli", "multinomial", "uniform")):
        return True
    pkt = _aten_packet(op)
    if pkt is not None:
        try:
            for ov in pkt.overloads():
                if torch.Tag.nondeterministic_seeded in getattr(pkt, ov).tags:
                    return True
        except Exception:
            pass
    return False


def tolerance(op, dtype):
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    if dtype in (torch.float32, torch.complex64) and any(
            op.name == p or (p.endswith(".") and op.name.startswith(p)) or op.name.startswith(p + ".")
            or (p.startswith("nn.functional.") and op.name.startswith(p)) for p in LOOSE_OPS):
        rtol, atol = 1e-4, 1e-4
    return rtol, atol


# ---------------------------------------------------------------------------------------------
# moving samples


def _to(x, device, grad=False):
    if isinstance(x, torch.Tensor):
        y = x.detach().to(device)
        if grad and x.requires_grad:
            y.requires_grad_(True)
        return y
    return x


def sample_args(sample):
    return (sample.input, *sample.args), dict(sample.kwargs)


# Ops whose non-input tensor arguments must stay on the CPU (index/section lists).
CPU_ARGS = {"tensor_split"}
# out= variants that PyTorch itself leaves unwritten for some samples (on CPU too), so
# the compared `out` tensors hold uninitialized memory: torch.fft.ihfftn over a single
# dim (torch 2.13 on CPU: `out` keeps its size and contents; the result is not in it).
OUT_UNWRITTEN = {"fft.ihfftn"}


def move_sample(sample, device, grad=False, op=None):
    args, kwargs = sample_args(sample)
    f = lambda x: _to(x, device, grad)  # noqa: E731
    if op is not None and op.name in CPU_ARGS:
        args = (f(args[0]),) + tuple(tree_map(lambda x: _to(x, "cpu"), args[1:]))
        kwargs = tree_map(lambda x: _to(x, "cpu"), kwargs)
        return args, kwargs
    args, kwargs = tree_map(f, args), tree_map(f, kwargs)
    if "device" in kwargs and kwargs["device"] is not None:  # factory functions
        kwargs["device"] = device
    return args, kwargs


def clone_tree(t):
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, t)


# ---------------------------------------------------------------------------------------------
# comparing


class Mismatch(AssertionError):
    pass


def _leaves(x):
    return tree_flatten(x)[0]


def compare(cpu, tpu, rtol, atol, values=True, path="out"):
    """Raises Mismatch when the trees differ (structure, tensor dtype/shape, values)."""
    cl, tl = _leaves(cpu), _leaves(tpu)
    if len(cl) != len(tl):
        raise Mismatch(f"{path}: {len(cl)} leaves on cpu, {len(tl)} on tpu")
    for i, (a, b) in enumerate(zip(cl, tl)):
        p = f"{path}[{i}]"
        if isinstance(a, torch.Tensor):
            if not isinstance(b, torch.Tensor):
                raise Mismatch(f"{p}: tensor on cpu, {type(b).__name__} on tpu")
            if b.device.type != DEVICE and a.device.type == "cpu" and a.numel() > 0:
                # outputs that live on cpu on both sides are fine; a cpu result from a tpu op is not
                pass
            if a.dtype != b.dtype:
                raise Mismatch(f"{p}: dtype {a.dtype} on cpu, {b.dtype} on tpu")
            if a.shape != b.shape:
                raise Mismatch(f"{p}: shape {tuple(a.shape)} on cpu, {tuple(b.shape)} on tpu")
            if not values:
                continue
            rt, at = TOLERANCES.get(a.dtype, (0.0, 0.0))  # e.g. float results of integer inputs
            rtol, atol = max(rtol, rt), max(atol, at)
            bc = b.detach().cpu()
            a = a.detach()
            if a.layout != torch.strided or bc.layout != torch.strided:
                a, bc = a.to_dense(), bc.to_dense()
            try:
                torch.testing.assert_close(bc, a, rtol=rtol, atol=atol, equal_nan=True,
                                           check_device=False, check_stride=False)
            except AssertionError as e:
                msg = str(e).strip().splitlines()
                raise Mismatch(f"{p}: " + " | ".join(m.strip() for m in msg[:4])) from None
        elif isinstance(a, float) and isinstance(b, (float, int)):
            if not (math.isclose(a, b, rel_tol=max(rtol, 1e-6), abs_tol=atol)
                    or (math.isnan(a) and math.isnan(b))):
                if values:
                    raise Mismatch(f"{p}: {a} on cpu, {b} on tpu")
        else:
            if values and a != b and not isinstance(a, (torch.dtype, torch.device)):
                raise Mismatch(f"{p}: {a!r} on cpu, {b!r} on tpu")


# ---------------------------------------------------------------------------------------------
# running


def _call(fn, args, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _fallbacks():
    return dict(torchtpu.metrics()["cpu_fallbacks"])


def _sync(x):
    # Host-read every tensor leaf so device errors surface inside the measured call.
    for t in _leaves(x):
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE:
            t.detach().cpu()


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300] if s else ''}"


def _record(variant, status, native=None, fallbacks=None, msg=""):
    return {"variant": variant, "status": status, "native": native,
            "fallbacks": sorted(fallbacks) if fallbacks else [], "msg": msg}


def _run_pair(variant, op, cpu_fn, tpu_fn, rtol, atol, values, skip_cpu_error=False):
    """cpu_fn() -> result (may raise); tpu_fn() -> result. Compares."""
    cpu_exc = None
    try:
        cpu_res = cpu_fn()
    except Exception as e:  # noqa: BLE001
        cpu_exc = e
    if cpu_exc is not None and skip_cpu_error:
        return _record(variant, "skip", msg="cpu raised: " + _short(cpu_exc))
    torchtpu.reset_metrics()
    tpu_exc = None
    try:
        tpu_res = tpu_fn()
        _sync(tpu_res)
    except Exception as e:  # noqa: BLE001
        tpu_exc = e
    fb = _fallbacks()
    native = not fb
    if cpu_exc is not None:
        if tpu_exc is None:
            return _record(variant, "fail", native, fb, "cpu raised " + _short(cpu_exc) + "; tpu did not")
        if isinstance(tpu_exc, type(cpu_exc)) or isinstance(cpu_exc, type(tpu_exc)):
            return _record(variant, "pass", native, fb, "both raised " + type(cpu_exc).__name__)
        return _record(variant, "fail", native, fb,
                       f"cpu raised {_short(cpu_exc)}; tpu raised {_short(tpu_exc)}")
    if tpu_exc is not None:
        return _record(variant, "error", native, fb, _short(tpu_exc))
    try:
        compare(cpu_res, tpu_res, rtol, atol, values)
    except Mismatch as e:
        return _record(variant, "fail", native, fb, str(e)[:500])
    except Exception as e:  # noqa: BLE001
        return _record(variant, "error", native, fb, "compare: " + _short(e))
    return _record(variant, "pass", native, fb)


def _grad_inputs(args, kwargs):
    return [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]


def _sum_outputs(out):
    ts = [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
          and (t.is_floating_point() or t.is_complex())]
    if not ts:
        return None
    s = ts[0].sum()
    for t in ts[1:]:
        s = s + t.sum()
    return s.real if s.is_complex() else s


def _grad(fn, args, kwargs):
    out = _call(fn, args, kwargs)
    s = _sum_outputs(out)
    ins = _grad_inputs(args, kwargs)
    if s is None or not ins:
        raise _NoGrad()
    gs = torch.autograd.grad(s, ins, allow_unused=True)
    return [g if g is not None else torch.zeros_like(i) for g, i in zip(gs, ins)]


class _NoGrad(Exception):
    pass


def _unwrap_dynamo(e: BaseException) -> BaseException:
    """Dynamo wraps user errors raised while tracing (TorchRuntimeError, BackendCompilerFailed,
    InternalTorchDynamoError...): compare the original exception type with CPU's."""
    import torch._dynamo.exc as dexc

    seen = 0
    while isinstance(e, dexc.TorchDynamoException) and e.__cause__ is not None and seen < 8:
        e = e.__cause__
        seen += 1
    if type(e).__name__ == "TorchRuntimeError" and e.__cause__ is not None:
        e = e.__cause__
    return e


def _compile_stats():
    from torchtpu.compile import lower as C
    from torch._dynamo.utils import counters

    return (dict(C.stats), dict(C._fallback_reasons), dict(counters["graph_break"]))


def _plain_call(op, *args, **kwargs):
    return op(*args, **kwargs)


@contextlib.contextmanager
def _no_seed_wrapper():
    """OpInfo wraps random ops (dropout...) in wrapper_set_seed, whose freeze_rng_state runs
    under no_dispatch(): Dynamo cannot trace that. Random outputs are compared by shape and
    dtype only, so the compiled variant calls the op directly."""
    import sys

    from torch.testing._utils import wrapper_set_seed as orig

    mods = [m for n, m in list(sys.modules.items())
            if n.startswith("torch.testing") and getattr(m, "wrapper_set_seed", None) is orig]
    for m in mods:
        m.wrapper_set_seed = _plain_call
    try:
        yield
    finally:
        for m in mods:
            m.wrapper_set_seed = orig


def _compiled_call(fn, args, kwargs):
    """Runs fn(*args, **kwargs) through torch.compile(backend="tpu"); returns (result, graph
    fallbacks): a list of reasons why (part of) the call did not run as compiled graphs."""
    def f(*a, **k):
        return fn(*a, **k)

    cf = torch.compile(f, backend="tpu", dynamic=False)
    s0, r0, b0 = _compile_stats()
    try:
        with _no_seed_wrapper():
            res = _call(cf, args, kwargs)
        _sync(res)
    except Exception as e:  # noqa: BLE001
        raise _unwrap_dynamo(e) from None
    s1, r1, b1 = _compile_stats()
    why = []
    if s1["graph_fallbacks"] != s0["graph_fallbacks"]:
        why += [f"graph:{k}" for k, v in r1.items() if v != r0.get(k, 0)] or ["graph:?"]
    why += [f"graph_break:{k.strip().splitlines()[0] if k.strip() else k}"[:200]
            for k, v in b1.items() if v != b0.get(k, 0)]
    if s1["graph_calls"] == s0["graph_calls"] and not why:
        why.append("graph:no graph")
    return res, why


VARIANTS = ("fn", "inplace", "out", "grad")
ALL_VARIANTS = VARIANTS + ("compiled",)


def run_sample(op, sample, dtype, variants=VARIANTS):
    """Runs one sample through the requested variants; returns a list of records."""
    rtol, atol = tolerance(op, dtype)
    values = not is_nondeterministic(op)
    recs = []
    fn = op.op

    if "fn" in variants:
        cargs, ckw = move_sample(sample, "cpu", op=op)
        targs, tkw = move_sample(sample, DEVICE, op=op)
        recs.append(_run_pair("fn", op, lambda: _call(fn, clone_tree(cargs), clone_tree(ckw)),
                              lambda: _call(fn, targs, tkw), rtol, atol, values))

    if "compiled" in variants:
        cargs, ckw = move_sample(sample, "cpu", op=op)
        targs, tkw = move_sample(sample, DEVICE, op=op)
        why = []

        def tpu_compiled():
            res, w = _compiled_call(fn, targs, tkw)
            why.extend(w)
            return res

        r = _run_pair("compiled", op, lambda: _call(fn, clone_tree(cargs), clone_tree(ckw)),
                      tpu_compiled, rtol, atol, values)
        if why:
            r["native"] = False
            r["fallbacks"] = sorted(set(r["fallbacks"]) | set(why))
        recs.append(r)

    if "inplace" in variants and op.inplace_variant is not None:
        ip = op.inplace_variant
        cargs, ckw = move_sample(sample, "cpu", op=op)
        targs, tkw = move_sample(sample, DEVICE, op=op)

        def cpu_ip():
            a = clone_tree(cargs)
            r = _call(ip, a, clone_tree(ckw))
            return (a[0], r)

        def tpu_ip():
            r = _call(ip, targs, tkw)
            return (targs[0], r)

        recs.append(_run_pair("inplace", op, cpu_ip, tpu_ip, rtol, atol, values, skip_cpu_error=True))

    if "out" in variants and op.supports_out and op_key(op) in OUT_UNWRITTEN:
        recs.append(_record("out", "skip", msg="PyTorch leaves out unwritten (OUT_UNWRITTEN)"))
    elif "out" in variants and op.supports_out:
        cargs, ckw = move_sample(sample, "cpu", op=op)
        try:
            expected = _call(fn, clone_tree(cargs), clone_tree(ckw))
        except Exception as e:  # noqa: BLE001
            expected = None
            recs.append(_record("out", "skip", msg="cpu raised: " + _short(e)))
        if expected is not None:
            targs, tkw = move_sample(sample, DEVICE, op=op)

            def make_out(dev):
                if isinstance(expected, torch.Tensor):
                    return torch.empty_like(expected, device=dev)
                if isinstance(expected, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in expected):
                    return tuple(torch.empty_like(t, device=dev) for t in expected)
                return None

            if make_out("cpu") is None:
                recs.append(_record("out", "skip", msg="non-tensor output"))
            else:
                def cpu_out():
                    o = make_out("cpu")
                    _call(fn, clone_tree(cargs), {**clone_tree(ckw), "out": o})
                    return o

                def tpu_out():
                    o = make_out(DEVICE)
                    _call(fn, targs, {**tkw, "out": o})
                    return o

                recs.append(_run_pair("out", op, cpu_out, tpu_out, rtol, atol, values,
                                      skip_cpu_error=True))

    if ("grad" in variants and op.supports_autograd and dtype == torch.float32 and values):
        cargs, ckw = move_sample(sample, "cpu", grad=True, op=op)
        targs, tkw = move_sample(sample, DEVICE, grad=True, op=op)
        if not _grad_inputs(cargs, ckw):
            recs.append(_record("grad", "skip", msg="no input requires grad"))
        else:
            r = _run_pair("grad", op, lambda: _grad(fn, cargs, ckw), lambda: _grad(fn, targs, tkw),
                          max(rtol, 1e-4), max(atol, 1e-4), True)
            if r["status"] == "pass" and r["msg"].startswith("both raised _NoGrad"):
                r = _record("grad", "skip", msg="no differentiable output")
            recs.append(r)
    return recs


def samples(op, dtype, requires_grad, limit=None):
    it = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    out = []
    for s in it:
        out.append(s)
        if limit is not None and len(out) >= limit:
            break
    return out


def run_op(op, dtype=torch.float32, limit=3, variants=VARIANTS, on_sample=None):
    """Runs the first `limit` samples of an OpInfo entry; returns a list of per-sample dicts."""
    results = []
    grad = (op.supports_autograd and dtype == torch.float32 and "grad" in variants
            and dtype in op.supported_backward_dtypes("cpu"))
    try:
        ss = samples(op, dtype, grad, limit)
    except Exception as e:  # noqa: BLE001
        rec = {"op": op_key(op), "dtype": str(dtype).replace("torch.", ""), "sample": -1,
               "desc": "", "records": [_record("samples", "error", msg="sample_inputs: " + _short(e))]}
        if on_sample:
            on_sample(rec)
        return [rec]
    if "compiled" in variants:
        torch._dynamo.reset()  # bounds memory and the recompile cache, one op at a time
    for i, s in enumerate(ss):
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                recs = run_sample(op, s, dtype, variants)
            except Exception as e:  # noqa: BLE001  harness bug or odd sample
                recs = [_record("fn", "error", msg="harness: " + _short(e))]
        rec = {"op": op_key(op), "dtype": str(dtype).replace("torch.", ""), "sample": i,
               "desc": _describe(s), "records": recs}
        if on_sample:
            on_sample(rec)
        results.append(rec)
    return results


def failures(results):
    """run_op's results -> (bad, fallbacks): a line for each record that neither passed nor was
    skipped, and the set of "variant:op" CPU / graph fallbacks of the records that ran."""
    bad, fallbacks = [], set()
    for r in results:
        for x in r["records"]:
            if x["status"] not in ("pass", "skip"):
                bad.append(f"sample {r['sample']} ({r['desc'][:80]}) {x['variant']}: {x['status']}: {x['msg']}")
            if x["status"] != "skip" and x["native"] is False:
                fallbacks.update(f"{x['variant']}:{f}" for f in x["fallbacks"])
    return bad, fallbacks


def _describe(s) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"T{list(x.shape)}:{str(x.dtype).replace('torch.', '')}"
        if isinstance(x, (list, tuple)):
            return "[" + ",".join(d(y) for y in x) + "]"
        return repr(x)[:40]

    parts = [d(s.input)] + [d(a) for a in s.args] + [f"{k}={d(v)}" for k, v in s.kwargs.items()]
    return ", ".join(parts)[:200]


def supports_dtype(op, dtype) -> bool:
    try:
        return dtype in op.supported_dtypes("cpu")
    except Exception:  # noqa: BLE001
        return False
