"""The default torch.compile backend (Inductor) on tpu tensors.

`torch.compile(model)` names no backend, so Dynamo hands the graph to
Inductor, which generates a graph's kernels with the code generator
registered for its device type; for "tpu" that is Inductor's own Pallas/JAX
path (meant for TPUs without torchtpu). transformers' `generate` compiles its
decode step the same way when given a `CompileConfig` (backend "inductor").

torchtpu registers its own code generation for "tpu" through Inductor's
public device registration (`register_backend_for_device`): a device pass
(`device_custom_pass`, run on each post-grad graph that touches a tpu
tensor) lowers the whole graph with torchtpu's registry into one StableHLO
program, exactly as `backend="tpu"` does, and replaces the graph's body by
one call of a custom op (`torchtpu::inductor_graph_<n>`), which Inductor calls as
an extern (fallback) kernel. So Inductor generates no kernel for tpu (the
scheduling registered for it refuses to, with a clear error). A graph the
registry cannot lower (or one with symbolic shapes) runs eagerly, warned and
counted in `metrics()["compile"]["graph_fallbacks"]`, as with `backend="tpu"`.

The wrapper code of such a graph refers to an in-process table of lowered
graphs, so the wrapper is marked not cacheable (Inductor's FX graph cache
skips these graphs); the XLA programs still come from torchtpu's caches.
"""
from __future__ import annotations

import copy
import itertools
import operator

import torch

from . import lower
from .graph_code import GraphCode

# key -> (GraphCode, placeholder kinds "t"/"i", indices of the outputs the op returns, their metadata)
_GRAPHS: dict[str, tuple] = {}
_counter = itertools.count()
_lib = None


def _inductor_graph(key: str, inputs: list, ints: list, mutated: list):
    code, kinds, returned, _ = _GRAPHS[key]
    ti, ii = iter(inputs), iter(ints)
    out = code([next(ti) if k == "t" else next(ii) for k in kinds])
    return _result(tuple(out[i] for i in returned))


def _fake(key: str, inputs: list, ints: list, mutated: list):
    return _result(tuple(torch.empty_strided(s, st, dtype=dt, device=dev) for s, st, dt, dev in _GRAPHS[key][3]))


def _result(res: tuple):
    """As the op's schema declares: one Tensor, a tuple of them, or None for a graph that only
    writes its inputs (``-> ()``, e.g. an in-place masked_fill_ of a function's argument)."""
    if not res:
        return None
    return res[0] if len(res) == 1 else res


_ops: dict[int, object] = {}


def _op(n: int):
    """torchtpu::inductor_graph_<n>: a graph with n computed outputs. Inductor calls a custom op
    that mutates inputs (`mutated` repeats the inputs the graph writes: a static KV cache, a
    buffer) only if it returns plain Tensors (not Tensor[]), hence one op per output count."""
    global _lib
    if n not in _ops:
        if _lib is None:
            _lib = torch.library.Library("torchtpu", "FRAGMENT")
        name = f"inductor_graph_{n}"
        ret = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
        _lib.define(f"{name}(str key, Tensor[] inputs, SymInt[] ints, Tensor(a!)[] mutated) -> {ret}")
        _lib.impl(name, _inductor_graph, "CompositeExplicitAutograd")
        torch.library.register_fake(f"torchtpu::{name}", _fake, lib=_lib)
        _ops[n] = getattr(torch.ops.torchtpu, name).default
    return _ops[n]


def _prims_to_aten(gm: torch.fx.GraphModule) -> None:
    """Inductor's decompositions leave a few prims in its graphs; the registry lowers
    their ATen equivalents."""
    prims = torch.ops.prims
    fma = getattr(prims, "fma", None)  # registered by torch._inductor.inductor_prims
    g = gm.graph
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target is prims.convert_element_type.default:
            n.target, n.args, n.kwargs = torch.ops.aten._to_copy.default, (n.args[0],), {"dtype": n.args[1]}
        elif n.target is prims.iota.default:
            length = n.args[0]
            start, step = n.kwargs["start"], n.kwargs["step"]
            n.target = torch.ops.aten.arange.start_step
            n.args = (start, start + step * length, step)
            n.kwargs = {"dtype": n.kwargs["dtype"], "device": n.kwargs["device"]}
        elif fma is not None and n.target is fma.default:  # a * b + c (Inductor's softmax backward)
            a, b, c = n.args
            n.target, n.args, n.kwargs = torch.ops.aten.addcmul.default, (c, a, b), {}
    gm.recompile()


def _size_nodes(outs: list, placeholders: set) -> set:
    """The nodes that compute the graph's non-tensor outputs (outs) with their ancestors up to
    the placeholders; they must compute sizes from sizes, not values from tensors."""
    seen: set = set()
    todo = list(outs)
    while todo:
        n = todo.pop()
        if n in seen or n in placeholders:
            continue
        if isinstance(n.meta.get("val"), torch.Tensor):
            raise RuntimeError(f"torchtpu: Inductor graph output {outs} is computed from the tensor "
                               f"{n.name}; use torch.compile(..., backend='tpu')")
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return seen


def _replace_split(gm: torch.fx.GraphModule) -> None:
    """A post-grad graph with functional collectives (DTensor's tensor parallelism): the graph is
    cut around each collective; every piece between them becomes one torchtpu::inductor_graph
    call, the collectives (and the opaque process-group inputs they take) stay Inductor's own
    extern kernels, run through the process group. The pieces are inlined back: Inductor
    takes a flat graph."""
    split = lower.cut_at_collectives(gm)
    flat = torch.fx.Graph()
    env: dict = {}
    for n in split.graph.nodes:
        if n.op == "call_module":
            sub = getattr(split, n.target)
            out = next(m for m in sub.graph.nodes if m.op == "output")
            single = not isinstance(out.args[0], (tuple, list))
            if single:  # the lowering takes a tuple of outputs
                out.args = ((out.args[0],),)
                sub.recompile()
            phs = [m for m in sub.graph.nodes if m.op == "placeholder"]
            if not any(lower.is_collective(m) for m in sub.graph.nodes):
                for ph, a in zip(phs, n.args):
                    ph.meta.setdefault("val", a.meta.get("val"))
                _replace_graph(sub)
            val_map = {ph: env[a] for ph, a in zip(phs, n.args)}
            res = flat.graph_copy(sub.graph, val_map)
            env[n] = res[0] if single else res
        elif n.op == "call_function" and n.target is operator.getitem and isinstance(env.get(n.args[0]), tuple):
            env[n] = env[n.args[0]][n.args[1]]
        elif n.op == "output":
            flat.output(torch.fx.map_arg(n.args[0], lambda a: env[a]))
        else:
            env[n] = flat.node_copy(n, lambda a: env[a])
    gm.graph = flat
    gm.graph.lint()
    gm.recompile()


def _replace_graph(gm: torch.fx.GraphModule) -> None:
    """Lowers gm (a post-grad graph) and replaces its body by one torchtpu::inductor_graph call."""
    g = gm.graph
    if any(lower.is_collective(n) for n in g.nodes):
        _replace_split(gm)
        return
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    # An opaque input (a process group) that the graph only returns as it is (a backward
    # graph's pass-through next to a cut at collectives) stays out of the program.
    passed = {n for n in placeholders
              if not isinstance(n.meta.get("val"), (torch.Tensor, int, torch.SymInt))
              and n.users and all(u.op == "output" for u in n.users)}
    prog_phs = [n for n in placeholders if n not in passed]
    kinds = []
    for n in prog_phs:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            kinds.append("t")
        elif isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):
            kinds.append("i")
        else:
            raise RuntimeError(f"torchtpu: Inductor graph input {n.name} is a {type(v).__name__}; "
                               "use torch.compile(..., backend='tpu')")
    original = torch.fx.GraphModule(gm, copy.deepcopy(g))
    if passed:
        names = {n.name for n in passed}
        o_out = next(n for n in original.graph.nodes if n.op == "output")
        o_out.args = (torch.fx.map_arg(o_out.args[0], lambda a: None if a.name in names else a),)
        for n in [n for n in original.graph.nodes if n.op == "placeholder" and n.name in names]:
            original.graph.erase_node(n)
        original.recompile()
    _prims_to_aten(original)
    try:
        program = lower._Lowerer(original).run()
    except lower.Unsupported as e:
        lower._fall_back(str(e))
        code = GraphCode(original, None, str(e))
    else:
        lower.stats["graphs_compiled"] += 1
        code = GraphCode(original, program)

    out_node = next(n for n in g.nodes if n.op == "output")
    outs = list(out_node.args[0])
    ph = set(placeholders)
    mutated = []
    for n in g.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default and n.args[0] in ph \
                and n.args[0] not in mutated:
            mutated.append(n.args[0])
    # The op returns the computed tensor outputs; an input returned as it is stays the input.
    returned = [i for i, o in enumerate(outs) if isinstance(o, torch.fx.Node) and o not in ph
                and isinstance(o.meta.get("val"), torch.Tensor)]
    # A size the graph returns (a SymInt, e.g. a sequence length under dynamic shapes) stays
    # an FX computation on the inputs' sizes, kept next to the call.
    host = _size_nodes([o for o in outs if isinstance(o, torch.fx.Node) and o not in ph
                        and not isinstance(o.meta.get("val"), torch.Tensor)], ph)
    vals = [outs[i].meta["val"] for i in returned]
    key = f"g{next(_counter)}"
    _GRAPHS[key] = (code, kinds, returned,
                    [(tuple(v.shape), tuple(v.stride()), v.dtype, v.device) for v in vals])
    with g.inserting_before(out_node):
        tensors = [n for n, k in zip(prog_phs, kinds) if k == "t"]
        ints = [n for n, k in zip(prog_phs, kinds) if k == "i"]
        call = g.call_function(_op(len(returned)), (key, tensors, ints, mutated))
        call.meta["val"] = vals[0] if len(vals) == 1 else tuple(vals)
        for k, i in enumerate(returned):
            if len(returned) == 1:
                outs[i] = call
                continue
            item = g.call_function(operator.getitem, (call, k))
            item.meta["val"] = vals[k]
            outs[i] = item
    out_node.args = (tuple(outs),)
    keep = set(placeholders) | {call, out_node} | set(call.users) | host
    for n in reversed(list(g.nodes)):
        if n not in keep:
            g.erase_node(n)
    g.lint()
    gm.recompile()


def _scheduling():
    from torch._inductor.scheduler import BaseScheduling

    class TpuScheduling(BaseScheduling):
        """torchtpu lowers whole tpu graphs itself (see the module docstring): no kernels."""

        def _refuse(self, *args, **kwargs):
            raise RuntimeError("torchtpu: Inductor was asked to generate a kernel for a tpu tensor; "
                               "torchtpu lowers tpu graphs as a whole (torch.compile(..., backend='tpu')). "
                               "Please report this graph.")

        codegen_node = codegen_template = codegen_combo_kernel = _refuse

        def group_fn(self, sizes):
            return tuple(tuple(s) for s in sizes)

        def flush(self):
            pass

    return TpuScheduling


def _wrapper():
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    class TpuWrapperCodegen(PythonWrapperCodegen):
        supports_caching = False  # the wrapper names an in-process graph table

    return TpuWrapperCodegen


def _pass():
    from torch._inductor.custom_graph_pass import (
        CustomGraphModulePass,
        get_hash_for_files,
    )

    class TpuGraphPass(CustomGraphModulePass):
        def __call__(self, gm: torch.fx.GraphModule) -> None:
            _replace_graph(gm)

        def uuid(self):
            return get_hash_for_files((__file__,))

    return TpuGraphPass()


def register() -> None:
    """Registers the tpu code generation with Inductor (called when Inductor's codegen loads)."""
    from torch._inductor.codegen.common import register_backend_for_device

    register_backend_for_device("tpu", _scheduling(), _wrapper(), device_custom_pass=_pass())
