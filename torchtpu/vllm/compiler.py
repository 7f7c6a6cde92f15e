"""vLLM's compiled steps on "tpu": torchtpu's compiler behind vLLM's public compile hooks.

vLLM compiles a model decorated with ``@support_torch_compile`` once with Dynamo, splits the
graph at its attention ops (``CompilationConfig.splitting_ops``) and hands every piece to the
platform's compiler: ``Platform.get_compile_backend()`` names a ``CompilerInterface``
(vllm/compilation/backends.py ``make_compiler``). :class:`TpuCompiler` is that compiler: each
piece becomes torchtpu's ``backend="tpu"`` program (AOTAutograd, the one lowering registry,
StableHLO, XLA), one per concrete token count.

Shapes come from vLLM's own buckets. The platform announces a static graph mode
(``support_static_graph_mode``) whose wrapper (:class:`TpuGraphWrapper`, named by
``get_static_graph_wrapper_cls``) replays nothing: it exists so that vLLM's CUDA-graph
dispatcher pads every step's token count up to one of ``cudagraph_capture_sizes``
(``CudagraphDispatcher.dispatch``) exactly as it does before replaying a CUDA graph. A piece
therefore sees only capture sizes (plus, above the largest, the exact counts, which the
scheduler bounds by ``max_num_batched_tokens``); the worker's warm-up runs each size once, and
serving compiles nothing afterwards.

**Full-graph steps** (the platform's default for compiled steps: ``splitting_ops = []``,
``cudagraph_mode = FULL``): vLLM hands over the whole model as ONE graph, its attention still
as vLLM's opaque ops (``unified_kv_cache_update``, ``unified_attention_with_output``), which
read the step's metadata and KV caches from vLLM's forward context at run time.
:func:`to_paged` rewrites each into torchtpu's own ops (``torchpu.paged.write_kv``,
``torchtpu::paged_attention``) over new graph inputs: each layer's KV cache, slot mapping,
``query_start_loc``, ``seq_lens`` and block table (and sinks). At every call
:class:`_PerShape` fetches those inputs from the forward context, so the model, every layer's
KV write and attention are one program per token bucket, every step's metadata an input. A
call without attention metadata (vLLM's profiling run) runs the original graph eagerly.
"""
from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

import torch

from vllm.compilation.compiler_interface import CompilerInterface
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.logger import init_logger

logger = init_logger(__name__)

COMPILER_QUALNAME = "torchtpu.vllm.compiler.TpuCompiler"
WRAPPER_QUALNAME = "torchtpu.vllm.compiler.TpuGraphWrapper"


def _shape_key(args) -> tuple:
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), a.dtype, a.device.type))
        elif isinstance(a, (int, float, bool)):
            key.append(a)
        else:
            key.append(type(a).__name__)
    return tuple(key)


_ATTN_OPS = ("vllm::unified_attention_with_output", "vllm::unified_kv_cache_update")


def _op_name(n: torch.fx.Node) -> str | None:
    if n.op != "call_function":
        return None
    t = n.target
    name = getattr(t, "_qualified_op_name", None)  # OpOverloadPacket
    if name is None and hasattr(t, "name") and hasattr(t, "_schema"):
        name = t._schema.name  # OpOverload
    return name


def _layer(n: torch.fx.Node, i: int, examples: dict) -> str:
    """The layer name argument: a string, or (vLLM on torch with opaque objects) a LayerName
    object, in the graph as an input whose example value is the object (or a fake of it)."""
    from vllm.utils.torch_utils import _resolve_layer_name

    a = n.args[i] if len(n.args) > i else n.kwargs["layer_name"]
    if isinstance(a, torch.fx.Node):
        a = examples[a]
        a = getattr(a, "real_obj", a)  # torch's FakeScriptObject wraps the real object
    name = _resolve_layer_name(a)
    if not isinstance(name, str):
        raise NotImplementedError(f"torchtpu's vLLM compiler: cannot read the attention layer name from {a!r}")
    return name


def to_paged(gm: torch.fx.GraphModule, layers: dict, example_inputs: list) -> tuple[list, list[int]]:
    """Rewrites vLLM's attention ops in ``gm`` (in place) into torchtpu.paged's ops over new
    inputs. Returns the new inputs' specs ``(kind, layer name)`` in order and the positions of
    the inputs it removed (layer-name objects no op reads any more). ``layers``: vLLM's
    ``static_forward_context`` (layer name -> Attention)."""
    from torchtpu.paged import write_kv

    g = gm.graph
    phs = [n for n in g.nodes if n.op == "placeholder"]
    examples = dict(zip(phs, example_inputs))
    nodes = [n for n in g.nodes if _op_name(n) in _ATTN_OPS]
    specs: list[tuple[str, str]] = []
    inputs: dict[tuple[str, str], torch.fx.Node] = {}
    last = phs[-1]

    def inp(kind: str, layer: str) -> torch.fx.Node:
        nonlocal last
        key = (kind, layer)
        if key not in inputs:
            with g.inserting_after(last):
                last = inputs[key] = g.placeholder(f"tpu_{kind}_{len(specs)}")
            specs.append(key)
        return inputs[key]

    for n in nodes:
        if _op_name(n) != "vllm::unified_attention_with_output":
            continue
        name = _layer(n, 4, examples)
        impl = layers[name].impl
        if n.kwargs.get("output_scale") is not None or n.kwargs.get("output_block_scale") is not None:
            raise NotImplementedError("torchtpu's vLLM attention: fused output quantization is not supported")
        q, out = n.args[0], n.args[3]
        meta = [inp(k, name) for k in ("qsl", "seq", "table")]
        sinks = inp("sinks", name) if impl.sinks is not None else None
        with g.inserting_before(n):
            res = g.call_function(torch.ops.torchtpu.paged_attention.default,
                                  (q, inp("cache", name), *meta, float(impl.scale), int(impl.sliding_window or 0),
                                   float(impl.logits_soft_cap or 0.0), sinks))
            g.call_function(torch.ops.aten.copy_.default, (out, res))
        g.erase_node(n)
    for n in nodes:
        if _op_name(n) != "vllm::unified_kv_cache_update":
            continue
        name = _layer(n, 2, examples)
        with g.inserting_before(n):
            g.call_function(write_kv, (inp("cache", name), n.args[0], n.args[1], inp("slots", name)))
            if n.users:  # vLLM's ordering token (an empty tensor) where something still reads it
                n.replace_all_uses_with(g.call_function(torch.ops.aten.new_empty.default, (n.args[0], [0])))
        g.erase_node(n)
    dropped = []
    for i, p in enumerate(phs):
        if not p.users and not isinstance(examples.get(p), (torch.Tensor, int, float, bool, torch.SymInt)):
            dropped.append(i)
            g.erase_node(p)
    g.lint()
    gm.recompile()
    return specs, dropped


_step_shapes: tuple[int, int] | None = None  # (request rows, block-table width) of the steps seen


def _paged_inputs(specs: list[tuple[str, str]]) -> list | None:
    """The rewritten graph's extra inputs for this call, from vLLM's forward context; None when
    the call has no attention metadata and cannot have any (vLLM's profiling run: no KV cache).

    A call without metadata once the caches are bound and a step's shapes are known (the
    drafter's warm-up, ``llm_base_proposer.dummy_run``, runs its model with none) runs as an
    empty step -- no request, every slot padding (written to the null block 0) -- so that its
    program is compiled at warm-up, not at the first request."""
    global _step_shapes
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    ctx = get_forward_context()
    md, slots = ctx.attn_metadata, ctx.slot_mapping
    empty = not isinstance(md, dict)
    if empty and (_step_shapes is None or ctx.batch_descriptor is None):
        return None
    if not isinstance(slots, dict):
        slots = {}
    from .attention import kv_base

    dev = next((ctx.no_compile_layers[l].kv_cache for k, l in specs if k == "cache"), None)
    if not isinstance(dev, torch.Tensor) or dev.numel() == 0:
        return None
    dev = dev.device
    out = []
    for kind, layer in specs:
        if kind == "cache":
            kv = ctx.no_compile_layers[layer].kv_cache
            if not isinstance(kv, torch.Tensor) or kv.numel() == 0:
                return None
            out.append(kv_base(kv))
        elif kind == "slots":
            s = slots.get(layer)
            if s is None:
                if not empty:
                    return None
                s = torch.full((ctx.batch_descriptor.num_tokens,), -1, dtype=torch.int64, device=dev)
            out.append(s)
        elif kind == "sinks":
            out.append(ctx.no_compile_layers[layer].impl.sinks)
        elif empty:
            rows, width = _step_shapes
            shape = {"qsl": (rows + 1,), "seq": (rows,), "table": (rows, width)}[kind]
            out.append(torch.zeros(shape, dtype=torch.int32, device=dev))
        else:
            m = md.get(layer)
            if m is None:
                return None
            _step_shapes = (m.seq_lens.shape[0], m.block_table.shape[1])
            out.append({"qsl": m.query_start_loc, "seq": m.seq_lens, "table": m.block_table}[kind])
    return out


class _PerShape:
    """One vLLM piece: torchtpu's program for each concrete shape of its inputs, built the
    first time that shape runs (vLLM hands a range-compiled piece symbolic example inputs,
    which no XLA program takes). A piece holding vLLM's attention ops (a full graph) runs
    rewritten by :func:`to_paged`, its extra inputs fetched per call."""

    def __init__(self, graph: torch.fx.GraphModule, name: str, example_inputs: list):
        self.graph = graph
        self.name = name
        self.programs: dict[tuple, Callable] = {}
        self.eager = graph  # runs the vLLM ops themselves (no attention metadata)
        self.specs, self.dropped = None, set()
        if any(_op_name(n) in _ATTN_OPS for n in graph.graph.nodes):
            from vllm.config import get_current_vllm_config
            from vllm.forward_context import get_forward_context, is_forward_context_available

            layers = (get_forward_context().no_compile_layers if is_forward_context_available()
                      else get_current_vllm_config().compilation_config.static_forward_context)
            self.eager = copy.deepcopy(graph)
            self.specs, dropped = to_paged(graph, layers, example_inputs)
            self.dropped = set(dropped)
            stats["full_graphs"] += 1

    def __call__(self, *args):
        if self.specs is not None:
            extra = _paged_inputs(self.specs)
            if extra is None:
                stats["eager_calls"] += 1
                return self.eager(*args)
            args = (*(a for i, a in enumerate(args) if i not in self.dropped), *extra)
        key = _shape_key(args)
        fn = self.programs.get(key)
        if fn is None:
            from torchtpu.compile.backend import backend

            fn = backend(self.graph, list(args))
            self.programs[key] = fn
            stats["programs"] += 1
            logger.debug("torchtpu: compiled %s for %s", self.name, key)
        stats["calls"] += 1
        return fn(*args)


stats = {"pieces": 0, "programs": 0, "calls": 0, "full_graphs": 0, "eager_calls": 0}


class TpuCompiler(CompilerInterface):
    """vLLM's compiler interface over torchtpu's ``backend="tpu"``.

    No handle is returned for vLLM's own artifact cache: torchtpu's persistent caches (the
    AOTAutograd cache and the XLA program cache under ``TORCHTPU_CACHE_DIR``) make a restart
    skip tracing and XLA compilation."""

    name = "torchtpu"

    def compute_hash(self, vllm_config) -> str:
        import torchtpu

        return hashlib.sha256(f"torchtpu {torchtpu.__version__}".encode()).hexdigest()[:10]

    def compile(self, graph: torch.fx.GraphModule, example_inputs: list[Any], compiler_config: dict[str, Any],
                compile_range, key: str | None = None):
        stats["pieces"] += 1
        return _PerShape(graph, key or f"piece{stats['pieces']}", list(example_inputs)), None


class TpuGraphWrapper(CUDAGraphWrapper):
    """vLLM's static-graph wrapper for tpu: calls the piece (or, in full-graph steps, the model).

    A CUDA graph fixes addresses; a torchtpu program is already one replayable executable
    per shape, so nothing is captured here. Its role is the padding vLLM applies to static
    graph modes (see the module docstring). A subclass of vLLM's CUDAGraphWrapper (whose
    constructor and call it replaces) so that vLLM's runner recognises and unwraps it."""

    def __init__(self, runnable: Callable[..., Any], vllm_config, runtime_mode, cudagraph_options=None,
                 **kwargs: Any) -> None:
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.compilation_config = vllm_config.compilation_config
        self.concrete_cudagraph_entries = {}
        self.is_debugging_mode = False

    def __getattr__(self, name: str) -> Any:
        # attribute access on the wrapped piece (vLLM's CUDAGraphWrapper does the same)
        if name == "runnable":
            raise AttributeError(name)
        return getattr(self.runnable, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.runnable(*args, **kwargs)
