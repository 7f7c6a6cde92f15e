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
serving compiles nothing afterwards. Attention runs eagerly between the pieces on its own
power-of-two shapes (torchtpu/vllm/attention.py).
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import torch

from vllm.compilation.compiler_interface import CompilerInterface
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


class _PerShape:
    """One vLLM piece: torchtpu's program for each concrete shape of its inputs, built the
    first time that shape runs (vLLM hands a range-compiled piece symbolic example inputs,
    which no XLA program takes)."""

    def __init__(self, graph: torch.fx.GraphModule, name: str):
        self.graph = graph
        self.name = name
        self.programs: dict[tuple, Callable] = {}

    def __call__(self, *args):
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


stats = {"pieces": 0, "programs": 0, "calls": 0}


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
        return _PerShape(graph, key or f"piece{stats['pieces']}"), None


class TpuGraphWrapper:
    """vLLM's static-graph wrapper for tpu (``AbstractStaticGraphWrapper``): calls the piece.

    A CUDA graph fixes addresses; a torchtpu program is already one replayable executable
    per shape, so nothing is captured here. Its role is the padding vLLM applies to static
    graph modes (see the module docstring)."""

    def __init__(self, runnable: Callable[..., Any], vllm_config, runtime_mode, **kwargs: Any) -> None:
        self.runnable = runnable
        self.runtime_mode = runtime_mode

    def __getattr__(self, name: str) -> Any:
        # attribute access on the wrapped piece (vLLM's CUDAGraphWrapper does the same)
        if name == "runnable":
            raise AttributeError(name)
        return getattr(self.runnable, name)

    def unwrap(self) -> Callable[..., Any]:
        return self.runnable

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.runnable(*args, **kwargs)
