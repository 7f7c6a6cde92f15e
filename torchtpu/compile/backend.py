"""torch.compile(backend="tpu"): the Dynamo backend and its registration.

Dynamo captures the graph, AOTAutograd produces functionalized forward and
backward ATen graphs, and each graph is handed to the C++ core, which replays
it through the same lowering registry as eager ops into ONE StableHLO program
(compiled once, then a cache hit on every call; persistent across restarts
through the on-disk cache). Input mutations stay in the graph and become
writes into the input's storage, donated in place. Graphs with functional
collectives are split at each collective.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch

from . import fake
from .lower import (
    Unsupported,
    cut_at_collectives,
    is_collective,
    _decomposition_table,
    _fall_back,
    _Lowerer,
    _runner,
    stats,
)

class _Segment(torch.nn.Module):
    """A compiled piece of a graph split at its collectives (unboxed calls)."""

    def __init__(self, run, single: bool):
        super().__init__()
        self.run, self.single = run, single

    def forward(self, *args):
        out = self.run(list(args))
        return out[0] if self.single else tuple(out)


def _split_at_collectives(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, int]:
    """Functional collectives (``_c10d_functional.*``, from DTensor and compiled
    DDP/FSDP) have no in-program lowering on the Gloo staging transport: the
    graph is cut around each one; the pieces between them compile to programs
    and the collectives run eagerly through the process group. Returns the
    split module and the number of compiled pieces."""
    from functorch.compile import make_boxed_func

    split = cut_at_collectives(gm)
    compiled = 0
    for name, sub in list(split.named_children()):
        if any(is_collective(n) for n in sub.graph.nodes):
            continue
        out = next(n for n in sub.graph.nodes if n.op == "output")
        single = not isinstance(out.args[0], (tuple, list))
        if single:
            out.args = ((out.args[0],),)
            sub.recompile()
        try:
            program = _Lowerer(sub).run()
        except Unsupported as e:
            _fall_back(f"a piece between collectives: {e}")
            if single:
                out.args = (out.args[0][0],)
                sub.recompile()
            continue
        run = _runner(program, program["cpu_updates"], lambda sub=sub: make_boxed_func(sub.forward))
        setattr(split, name, _Segment(run, single))
        compiled += 1
    return split, compiled


def _graph_compiler(gm: torch.fx.GraphModule, example_inputs):
    """AOTAutograd's compiler for each forward/backward/inference graph: a GraphCode."""
    # graph_code imports Inductor's OutputCode (and with it Dynamo): only when compiling,
    # so `import torchtpu` stays free of both (tests/test_compile.py).
    from .graph_code import GraphCode
    if any(is_collective(n) for n in gm.graph.nodes):
        split, compiled = _split_at_collectives(gm)
        stats["graphs_split"] += 1
        stats["graphs_compiled"] += compiled
        # the split module runs as Python (not cached: GraphCode without a program)
        return GraphCode(split, None, "split at collectives")
    try:
        program = _Lowerer(gm, alias_views=True).run()
    except Unsupported as e:
        _fall_back(str(e))
        return GraphCode(gm, None, str(e))
    stats["graphs_compiled"] += 1
    return GraphCode(gm, program)


_AOT_COUNTERS = {"autograd_cache_hit": "aot_cache_hits", "autograd_cache_miss": "aot_cache_misses",
                 "autograd_cache_bypass": "aot_cache_bypasses"}


def backend(gm, example_inputs, **kwargs):
    """The Dynamo backend registered as "tpu".

    With the persistent cache on, AOTAutograd's own cache stores each graph's
    result (a GraphCode) under TORCHTPU_CACHE_DIR, so a restart skips tracing."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import counters
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    from .graph_code import GraphCode, aot_cache_scope

    with aot_cache_scope() as cached:
        # a new AotAutograd per graph: it wraps its backward compiler on every call
        fw = SerializableAOTDispatchCompiler(GraphCode, _graph_compiler) if cached else _graph_compiler
        aot = aot_autograd(fw_compiler=fw, bw_compiler=_graph_compiler, decompositions=_decomposition_table(),
                           keep_inference_input_mutations=True)
        before = {k: counters["aot_autograd"][k] for k in _AOT_COUNTERS}
        try:
            return aot(gm, example_inputs, **kwargs)
        finally:
            for k, name in _AOT_COUNTERS.items():
                stats[name] += counters["aot_autograd"][k] - before[k]


_REGISTRY = "torch._dynamo.backends.registry"
_INDUCTOR = "torch._inductor.compile_fx"


def _register_now() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "tpu" not in _COMPILER_FNS:
        register_backend(name="tpu")(backend)
    fake.register()


def _register_inductor() -> None:
    from . import inductor

    inductor.register()


# module -> what registers with it once it is imported
_HOOKS = {_REGISTRY: _register_now, _INDUCTOR: _register_inductor}


class _RegisterWhenLoaded(importlib.abc.MetaPathFinder):
    """Registers the backend the moment Dynamo's backend registry is imported
    (by torch.compile or anything else), and torchtpu's tpu code generation
    the moment Inductor's compile_fx is, so that importing torchtpu does not
    import torch._dynamo (about a second) or Inductor for users who never
    compile."""

    def __init__(self):
        self.pending = {m: f for m, f in _HOOKS.items() if m not in sys.modules}

    def find_spec(self, fullname, path, target=None):
        register_fn = self.pending.pop(fullname, None)
        if register_fn is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):  # the import system has put module in sys.modules
            exec_module(module)
            register_fn()

        spec.loader.exec_module = exec_then_register
        return spec


def register() -> None:
    for name, register_fn in _HOOKS.items():
        if name in sys.modules:
            register_fn()
    if not all(m in sys.modules for m in _HOOKS) and \
            not any(isinstance(f, _RegisterWhenLoaded) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenLoaded())


