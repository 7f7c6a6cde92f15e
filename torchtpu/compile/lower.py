"""torch.compile(backend="tpu"), the lowering: an ATen FX graph becomes one
StableHLO program through the C++ core's lowering registry (the same one eager
ops use), and the boxed function that runs it. The bottom of torchtpu.compile:
graph_code, inductor and backend import it; it imports none of them.
"""
from __future__ import annotations

import operator
import sys
import warnings
from typing import Any

import torch
from torch._ops import OpOverload

_ET = {torch.bool: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.uint8: 5,
       torch.uint16: 6, torch.uint32: 7, torch.uint64: 8, torch.float16: 9, torch.bfloat16: 10,
       torch.float32: 11, torch.float64: 12, torch.complex64: 13, torch.complex128: 14,
       torch.float8_e4m3fn: 15, torch.float8_e5m2: 16, torch.float8_e8m0fnu: 17,
       torch.float8_e4m3fnuz: 19, torch.float8_e5m2fnuz: 20}

stats = {"graphs_compiled": 0, "graphs_split": 0, "graph_fallbacks": 0, "graph_calls": 0, "graphs_loaded": 0,
         "aot_cache_hits": 0, "aot_cache_misses": 0, "aot_cache_bypasses": 0}
_fallback_reasons: dict[str, int] = {}


class Unsupported(Exception):
    pass


def op_name(target: OpOverload) -> str:
    name = target._schema.name
    ov = target._overloadname
    return name if ov == "default" else f"{name}.{ov}"


def _et(dtype: torch.dtype) -> int:
    if dtype not in _ET:
        raise Unsupported(f"dtype {dtype}")
    return _ET[dtype]


# Varlen attention's ops: (1) the int arguments no lowering reads (the dense
# flash-attention lowerings ignore the longest sequence lengths), so a symbolic
# value there (torchtitan's VarlenMetadata.max_q, a Python int that changes with
# each batch, which Dynamo's automatic dynamic shapes turns into a graph input)
# does not keep the graph from lowering; (2) the cumulative-offset arguments ->
# index of the tokens tensor (total, heads, dim) whose first dimension they partition.
_VARLEN_ARGS = {
    "torch_attn::_varlen_attn": (("max_q", "max_k"), {"cu_seq_q": 0, "cu_seq_k": 1}),
    "torch_attn::_varlen_attn_backward": (("max_q", "max_k"), {"cu_seq_q": 1, "cu_seq_k": 2}),
    "aten::_flash_attention_forward": (("max_q", "max_k"), {"cum_seq_q": 0, "cum_seq_k": 1}),
    "aten::_flash_attention_backward": (("max_q", "max_k"), {"cum_seq_q": 1, "cum_seq_k": 2}),
}


def _offsets_bucket(n: torch.fx.Node) -> int | None:
    """Static length for a 1-D integer input of symbolic length (the number of
    documents in a packed batch changes with each batch) that only varlen
    attention reads, as cumulative offsets (the graph may also return it for
    the backward): one more than the tokens it partitions. At call time it is
    padded with its last offset, i.e. empty documents, which change nothing, so
    one program serves every batch. None: not such an input."""
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dim() != 1 or val.dtype not in (torch.int32, torch.int64):
        return None
    size = 0
    for u in n.users:
        if u.op == "output":
            continue
        if u.op != "call_function" or not isinstance(u.target, OpOverload):
            return None
        spec = _VARLEN_ARGS.get(op_name(u.target), ((), None))[1]
        if spec is None:
            return None
        for k, sa in enumerate(u.target._schema.arguments):
            a = u.args[k] if k < len(u.args) else u.kwargs.get(sa.name)
            if a is not n:
                continue
            if sa.name not in spec:
                return None
            t = spec[sa.name]
            tok = (u.args[t] if t < len(u.args) else None)
            tv = tok.meta.get("val") if isinstance(tok, torch.fx.Node) else None
            if not isinstance(tv, torch.Tensor) or _is_symbolic(tv):
                return None
            size = max(size, int(tv.shape[0]) + 1)
    return size or None


def _is_symbolic(x) -> bool:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in list(x.shape) + list(x.stride()))
    return False


_CPU_SCALAR_DTYPES = (torch.bool, torch.float32, torch.float64, torch.int64, torch.int32)


def _cpu_scalar(a) -> bool:
    """A 0-d CPU tensor the graph takes as a scalar program argument (kept on the CPU)."""
    return (isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.dim() == 0
            and a.dtype in _CPU_SCALAR_DTYPES)


def _cpu_slice(gm: torch.fx.GraphModule, targets: list, placeholders: list):
    """A CPU function computing `targets` (nodes) from CPU placeholders only.

    An optimizer's CPU step count is updated in place inside the graph; the
    device program reads it as a scalar and this slice computes the new value
    on the host, so no device-to-host copy is needed."""
    needed, stack = set(), list(targets)
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        stack.extend(n.all_input_nodes)
    g = torch.fx.Graph()
    env, used = {}, []
    for n in gm.graph.nodes:
        if n not in needed:
            continue
        if n.op == "placeholder":
            v = n.meta.get("val")
            if not isinstance(v, torch.Tensor) or v.device.type != "cpu":
                raise Unsupported("a CPU input is updated from device values")
            env[n] = g.placeholder(n.name)
            used.append(placeholders.index(n))
        elif n.op == "call_function":
            env[n] = g.node_copy(n, lambda x: env[x])
        else:
            raise Unsupported(f"CPU input update through a {n.op} node")
    g.output(tuple(env[t] for t in targets))
    return torch.fx.GraphModule(gm, g), used


class _Lowerer:
    def __init__(self, gm: torch.fx.GraphModule, alias_views: bool = False):
        self.gm = gm
        self.next = 0
        self.ids: dict[torch.fx.Node, Any] = {}
        self.constants: list[torch.Tensor] = []  # get_attr tensors, passed after the graph inputs
        self.cpu_outputs: list[int] = []  # outputs the graph produces on the CPU
        # outputs that are views of an unmutated device input (a forward graph's saved t(weight)):
        # (output index, input index, sizes, strides, storage offset), made on the host as views
        # of the input, as eager and Inductor do, instead of program outputs (each a copy of the
        # input in the program). Off for the Inductor device pass (its op's outputs may not alias).
        self.alias_views = alias_views
        self.alias_outputs: list[tuple[int, int, list[int], list[int], int]] = []
        # varlen offsets of symbolic length: (input index, static length), padded at call time
        self.pad_inputs: list[tuple[int, int]] = []
        # int outputs: (output index, input index or None, constant); an input is returned
        # as the caller gave it (also a padded offsets input)
        self.int_outputs: list[tuple[int, int | None, int | None]] = []
        self.cpu_updates = None  # (fn, its input indices, mutated input indices) for CPU inputs updated in place

    def new(self) -> int:
        self.next += 1
        return self.next - 1

    def tensor_id(self, a) -> int:
        if not isinstance(a, torch.fx.Node):
            raise Unsupported(f"non-node tensor argument {type(a)}")
        v = self.ids[a]
        if isinstance(v, (tuple, list)):
            raise Unsupported("tuple used as a tensor")
        return v

    def arg_spec(self, typ, a):
        k = typ.kind()
        if k == "OptionalType":
            if a is None:
                return ("n",)
            return self.arg_spec(typ.getElementType(), a)
        if a is None:
            return ("n",)
        if k == "TensorType":
            if isinstance(a, (bool, int, float)) and not isinstance(a, torch.fx.Node):
                return self.arg_spec(torch._C.NumberType.get(), a)  # wrapped number
            return ("t", self.tensor_id(a))
        if k == "ListType":
            el = typ.getElementType()
            ek = el.kind()
            if ek == "TensorType":
                return ("tl", [self.tensor_id(x) for x in a])
            if ek == "OptionalType" and el.getElementType().kind() == "TensorType":
                return ("otl", [-1 if x is None else self.tensor_id(x) for x in a])
            if ek in ("IntType", "SymIntType"):
                if any(isinstance(x, torch.fx.Node) or _is_symbolic(x) for x in a):
                    raise Unsupported("symbolic int list")
                return ("il", [int(x) for x in a])
            if ek == "FloatType":
                return ("fl", [float(x) for x in a])
            if ek == "BoolType":
                return ("bl", [bool(x) for x in a])
            raise Unsupported(f"list of {ek}")
        if isinstance(a, torch.dtype):
            return ("dt", _et(a))
        if isinstance(a, (torch.layout, torch.device, torch.memory_format)):
            return ("n",)
        if isinstance(a, torch.fx.Node) or _is_symbolic(a):
            raise Unsupported(f"symbolic {k} argument")
        if isinstance(a, torch.dtype):  # ScalarType arguments report IntType
            return ("dt", _et(a))
        if isinstance(a, (torch.layout, torch.memory_format, torch.device)):
            return ("n",)
        if k in ("IntType", "SymIntType"):
            return ("i", int(a))
        if k == "FloatType":
            return ("f", float(a))
        if k == "BoolType":
            return ("b", bool(a))
        if k == "NumberType":
            if isinstance(a, bool):
                return ("s", a, "b")
            if isinstance(a, int):
                return ("s", a, "i")
            if isinstance(a, complex):
                raise Unsupported("complex scalar")
            return ("s", float(a), "f")
        if k == "StringType":
            return ("str", str(a))
        if k == "ScalarTypeType":
            return ("dt", _et(a))
        return ("n",)  # Layout, Device, MemoryFormat, Generator: not needed by lowerings

    def run(self):
        from .. import _C

        g = self.gm.graph
        input_ids, nodes, outputs, out_meta, mutations = [], [], [], [], []
        placeholders = [n for n in g.nodes if n.op == "placeholder"]
        for n in placeholders:
            val = n.meta.get("val")
            # a symbolic int input is a scalar program argument (its uses decide whether
            # the graph lowers); a tensor with symbolic sizes is a dynamic shape
            if _is_symbolic(val) and not isinstance(val, torch.SymInt):
                bucket = _offsets_bucket(n)
                if bucket is None:
                    raise Unsupported("dynamic shapes")
                self.pad_inputs.append((len(input_ids), bucket))
            i = self.new()
            self.ids[n] = i
            input_ids.append(i)
        ph_index = {n: k for k, n in enumerate(placeholders)}
        cpu_mut = []
        for n in g.nodes:  # lifted constants (e.g. a tensor literal): extra inputs after the args
            if n.op == "get_attr":
                c = self.gm
                for part in n.target.split("."):
                    c = getattr(c, part)
                if not isinstance(c, torch.Tensor) or _is_symbolic(c):
                    raise Unsupported(f"get_attr of {type(c).__name__}")
                if c.layout != torch.strided or c.dtype not in _ET:
                    raise Unsupported(f"constant {c.dtype} {c.layout}")
                i = self.new()
                self.ids[n] = i
                input_ids.append(i)
                self.constants.append(c)
        for n in g.nodes:
            if n.op == "call_function":
                if n.target is operator.getitem:
                    self.ids[n] = self.ids[n.args[0]][n.args[1]]
                    continue
                if not isinstance(n.target, OpOverload):
                    raise Unsupported(f"call to {n.target}")
                name = op_name(n.target)
                schema = n.target._schema
                if name == "aten::copy_.default" or name == "aten::copy_":
                    dst, src = n.args[0], n.args[1]
                    if dst in ph_index and dst.meta["val"].device.type == "cpu":
                        cpu_mut.append((ph_index[dst], src))
                        self.ids[n] = self.ids[dst]
                        continue
                    if dst in ph_index:
                        src_id = self.tensor_id(src)
                        dv, sv = dst.meta["val"], src.meta["val"]
                        if tuple(dv.shape) != tuple(sv.shape) or dv.dtype != sv.dtype:
                            raise Unsupported("copy_ into an input with a different shape/dtype")
                        mutations.append((ph_index[dst], src_id))
                        self.ids[n] = self.ids[dst]
                        continue
                if not _C._has_lowering(name):
                    raise Unsupported(f"no lowering for {name}")
                specs = []
                for k, sa in enumerate(schema.arguments):
                    if k < len(n.args):
                        a = n.args[k]
                    elif sa.name in n.kwargs:
                        a = n.kwargs[sa.name]
                    elif sa.has_default_value():
                        a = sa.default_value
                    else:
                        a = None
                    if sa.name in _VARLEN_ARGS.get(name, ((),))[0] and (isinstance(a, torch.fx.Node) or _is_symbolic(a)):
                        specs.append(("i", -1))  # never read by the lowering
                        continue
                    specs.append(self.arg_spec(sa.type, a))
                val = n.meta.get("val")
                vals = list(val) if isinstance(val, (tuple, list)) else [val]
                # Lowerings return values for the defined outputs only (masked
                # outputs, e.g. convolution_backward's output_mask, are None).
                # A returned Tensor[] inside a tuple (the functional fused
                # optimizers) is a nested tuple of ids, flattened in order.
                outs, out_ids, tuple_ids = [], [], []

                def out_id(v):
                    if _is_symbolic(v):
                        raise Unsupported("dynamic shapes")
                    outs.append((_et(v.dtype), list(v.shape)))
                    out_ids.append(self.new())
                    return out_ids[-1]

                for v in vals:
                    if isinstance(v, torch.Tensor):
                        tuple_ids.append(out_id(v))
                    elif isinstance(v, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in v):
                        tuple_ids.append(tuple(out_id(t) for t in v))
                    else:
                        tuple_ids.append(-1)
                nodes.append((name, specs, outs, out_ids, [sa.name for sa in schema.arguments]))
                self.ids[n] = tuple(tuple_ids) if isinstance(val, (tuple, list)) else tuple_ids[0]
            elif n.op == "output":
                for o in n.args[0]:
                    if o is None:  # e.g. no gradient for an input
                        outputs.append(-1)
                        out_meta.append((0, [], []))
                        continue
                    v = o.meta.get("val") if isinstance(o, torch.fx.Node) else o
                    given = isinstance(o, torch.fx.Node) and o in ph_index and (
                        any(i == ph_index[o] for i, _ in self.pad_inputs)
                        or isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool))
                    if given or isinstance(o, int) and not isinstance(o, bool):
                        # an input the forward graph hands to the backward as the caller gave it
                        # (padded offsets, a symbolic max_q), or an int constant: next to the program
                        outputs.append(-1)
                        out_meta.append((0, [], []))
                        self.int_outputs.append((len(outputs) - 1, ph_index[o] if given else None,
                                                 None if given else o))
                        continue
                    if not isinstance(o, torch.fx.Node) or not isinstance(v, torch.Tensor):
                        raise Unsupported("non-tensor graph output")
                    src = self._input_view_of(o, v, ph_index, {k for k, _ in mutations} | {k for k, _ in cpu_mut})
                    if src is not None:
                        outputs.append(-1)
                        out_meta.append((0, [], []))
                        self.alias_outputs.append((len(outputs) - 1, src, list(v.shape), list(v.stride()),
                                                   v.storage_offset()))
                        continue
                    outputs.append(self.tensor_id(o))
                    out_meta.append((_et(v.dtype), list(v.shape), list(v.stride())))
                    if v.device.type == "cpu":
                        self.cpu_outputs.append(len(outputs) - 1)
            elif n.op in ("placeholder", "get_attr"):
                continue
            else:
                raise Unsupported(f"node kind {n.op}")
        if cpu_mut:
            fn, used = _cpu_slice(self.gm, [src for _, src in cpu_mut], placeholders)
            self.cpu_updates = (fn, used, [k for k, _ in cpu_mut])
        return {"build": (self.next, input_ids, nodes, outputs, out_meta, mutations),
                "constants": self.constants, "cpu_outputs": self.cpu_outputs, "cpu_updates": self.cpu_updates,
                "alias_outputs": self.alias_outputs, "int_outputs": self.int_outputs,
                "pad_inputs": self.pad_inputs}

    _VIEW_OPS = (torch.ops.aten.t.default, torch.ops.aten.permute.default, torch.ops.aten.transpose.int,
                 torch.ops.aten.view.default, torch.ops.aten.expand.default, torch.ops.aten.alias.default,
                 torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim, torch.ops.aten.slice.Tensor,
                 torch.ops.aten.select.int)

    def _input_view_of(self, o: torch.fx.Node, v: torch.Tensor, ph_index: dict, mutated: set):
        """The index of the device input whose view output o is (a chain of view ops from a
        placeholder sharing its storage), or None."""
        if not self.alias_views or o.op == "placeholder":
            return None
        n = o
        while n.op == "call_function" and n.target in self._VIEW_OPS and isinstance(n.args[0], torch.fx.Node):
            n = n.args[0]
        if n is o or n not in ph_index or ph_index[n] in mutated:
            return None
        pv = n.meta.get("val")
        if not isinstance(pv, torch.Tensor) or pv.device.type != "tpu" or pv.dtype != v.dtype:
            return None
        from torch.multiprocessing.reductions import StorageWeakRef
        if StorageWeakRef(pv.untyped_storage()) != StorageWeakRef(v.untyped_storage()):
            return None
        return ph_index[n]


def _fall_back(reason: str) -> None:
    stats["graph_fallbacks"] += 1
    _fallback_reasons[reason] = _fallback_reasons.get(reason, 0) + 1
    warnings.warn(f"torchtpu.compile: running this graph eagerly ({reason})")


def _runner(program: dict, cpu_updates, make_eager):
    """The boxed function running a lowered graph (built on a GraphCode's first call);
    make_eager() gives the eager fallback for a graph a lowering rejects."""
    from .. import _C

    graph = _C._build_graph(str(id(program)), *program["build"])
    consts = program["constants"]
    cpu_outputs = program["cpu_outputs"]
    alias_outputs = program.get("alias_outputs", ())
    int_outputs = program.get("int_outputs", ())
    pad_inputs = program.get("pad_inputs", ())
    dev_consts: list[torch.Tensor] = []
    state = {"eager": None}

    def run(args):
        if state["eager"] is not None:
            return state["eager"](args)
        if consts and not dev_consts:
            dev_consts.extend(c if c.device.type == "tpu" else c.to("tpu") for c in consts)
        stats["graph_calls"] += 1
        # CPU tensors in the graph (a CPU index tensor from a closure, an optimizer's CPU step
        # count) run on the device; CPU inputs the graph mutates get the new value copied back.
        ins = [a.to("tpu") if isinstance(a, torch.Tensor) and a.device.type == "cpu" and not _cpu_scalar(a)
               else a for a in args]
        new_cpu = cpu_updates[0](*[args[i] for i in cpu_updates[1]]) if cpu_updates else ()
        given = list(ins)
        for i, size in pad_inputs:
            a = ins[i]
            if a.shape[0] > size:  # empty documents beyond the tokens: the next power of two
                size = 1 << (int(a.shape[0]) - 1).bit_length()
            if a.shape[0] < size:
                ins[i] = torch.cat([a, a[-1:].expand(size - a.shape[0])])
        try:
            out = _C._run_graph(graph, ins + dev_consts)
        except _C._LowerError as e:
            # A lowering rejected its arguments (e.g. a boolean-mask index_put): the graph is
            # abandoned before anything is written; this graph runs eagerly from now on.
            stats["graph_calls"] -= 1
            stats["graphs_compiled"] -= 1
            state["eager"] = make_eager()
            _fall_back(str(e).splitlines()[0].replace("torchtpu.compile: ", "")[:200])
            return state["eager"](args)
        if cpu_updates:
            for k, v in zip(cpu_updates[2], new_cpu):
                args[k].copy_(v)
        for k in cpu_outputs:
            out[k] = out[k].cpu()
        for k, i, size, stride, offset in alias_outputs:
            out[k] = ins[i].as_strided(size, stride, offset)
        for k, i, const in int_outputs:
            out[k] = given[i] if i is not None else const
        args.clear()
        return out

    run._boxed_call = True
    return run


_decomps = None


def _decomposition_table() -> dict:
    """core ATen decompositions, less the ops the C++ core lowers natively."""
    global _decomps
    if _decomps is None:
        from torch._decomp import core_aten_decompositions

        from .. import _C

        table = dict(core_aten_decompositions())
        # Functionalization's view inverses (slice/select/diagonal_scatter: a
        # compiled backward writing into a slice of a gradient, a setitem on a
        # view) are lowered (ops/views.cpp), never decomposed: torch's
        # decompositions (where/index) give them an elementwise op's strides
        # where the meta kernels keep the input's, and functionalization views
        # the result back into its base with those strides.
        _decomps = {op: fn for op, fn in table.items()
                    if not (isinstance(op, OpOverload) and _C._has_lowering(op_name(op)))}
    return _decomps


def metrics() -> dict:
    from .. import _C

    breaks = 0
    if "torch._dynamo.utils" in sys.modules:  # else nothing was compiled: don't import Dynamo
        from torch._dynamo.utils import counters

        breaks = sum(counters["graph_break"].values())
    lowerings, replays = _C._graph_counts()
    return {**stats, "graph_lowerings": lowerings, "graph_replays": replays,
            "graph_fallback_reasons": dict(_fallback_reasons), "graph_breaks": breaks}


_COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional")


def is_collective(n: torch.fx.Node) -> bool:
    """A functional collective (DTensor's, compiled DDP/FSDP's): no in-program lowering."""
    return n.op == "call_function" and isinstance(n.target, OpOverload) and \
        n.target.namespace in _COLLECTIVE_NAMESPACES


def cut_at_collectives(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """gm split into submodules: each collective alone, the nodes between collectives together
    (in order)."""
    from torch.fx.passes.split_module import split_module

    part, parts = 0, {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        if is_collective(n):
            parts[n] = part + 1
            part += 2
        else:
            parts[n] = part
    return split_module(gm, None, lambda n: parts[n], keep_original_order=True)

