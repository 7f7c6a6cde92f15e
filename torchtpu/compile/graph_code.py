"""A compiled graph of torch.compile(backend="tpu"), in a form AOTAutograd's
own cache (torch._functorch AOTAutogradCache, bundled mode) can store.

`GraphCode` is a torch OutputCode: it holds only plain data, namely the
lowered node list `_C._build_graph` takes, the graph's constants as CPU
tensors, the source of the host function that updates CPU inputs (an
optimizer's step count) and the source of the graph itself (the eager
fallback, should a lowering reject its arguments). It builds the runnable on
its first call, so a graph loaded from the cache costs no tracing, and its
XLA program comes from torchtpu's executable cache. A graph that runs eagerly
from the start is not cached (AOTAutograd bypasses its cache for it).

`aot_cache_scope()` turns the cache on for the duration of one backend call
only: the torch config patches torch itself uses for serializable custom
compilers, a cache key tag naming this torchtpu, and the cache directory
under TORCHTPU_CACHE_DIR (torch names it by the environment variable
TORCHINDUCTOR_CACHE_DIR, restored afterwards).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from typing import Any

import torch
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
from torch._inductor.output_code import OutputCode
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import cache
from . import lower


def _cpu_copy(name: str, v: torch.Tensor) -> tuple:
    if v.layout != torch.strided or type(v) is not torch.Tensor:
        raise BypassAOTAutogradCache(f"torchtpu: graph attribute {name} is a {type(v).__name__}")
    return v.detach().cpu(), v.device.type


def _source(gm: torch.fx.GraphModule) -> tuple:
    """A GraphModule as plain data: its generated code, and its tensor attributes and
    buffers (the graph's constants) as CPU tensors with their device."""
    _, (body, import_block) = gm.__reduce__()
    if body.get("_modules") or body.get("_parameters"):
        raise BypassAOTAutogradCache("torchtpu: graph holds submodules or parameters")
    tensors = {k: _cpu_copy(k, v) for k, v in body.items() if isinstance(v, torch.Tensor)}
    buffers = {k: _cpu_copy(k, v) for k, v in (body.get("_buffers") or {}).items() if v is not None}
    body = {k: v for k, v in body.items() if k not in tensors and k != "_buffers"}
    try:
        pickle.dumps(body)
    except Exception as e:
        raise BypassAOTAutogradCache(f"torchtpu: graph attributes do not pickle ({e})") from e
    return body, import_block, tensors, buffers


def _from_source(src: tuple) -> torch.fx.GraphModule:
    from torch.fx.graph_module import reduce_graph_module

    body, import_block, tensors, buffers = src
    body = dict(body)
    for k, (t, dev) in tensors.items():
        body[k] = t.to(dev)
    body["_buffers"] = {k: t.to(dev) for k, (t, dev) in buffers.items()}
    return reduce_graph_module(body, import_block)


def _fingerprint() -> str:
    """What a cached graph depends on besides torch's key: this package's code and which
    ops the C++ core lowers (that decides the decompositions AOTAutograd applies and
    whether a graph lowers at all)."""
    from .. import _C

    h = hashlib.sha256()
    here = os.path.dirname(__file__)
    for path in sorted(os.path.join(here, f) for f in os.listdir(here) if f.endswith(".py")):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(repr(sorted(_C._lowered_ops())).encode())
    return "torchtpu-" + h.hexdigest()[:24]


_FINGERPRINT: str | None = None


class GraphCode(OutputCode):
    """One compiled forward, backward or inference graph (see the module docstring)."""

    def __init__(self, gm: torch.fx.GraphModule, program: dict | None, reason: str = ""):
        super().__init__()
        self._boxed_call = True  # in the instance dict: wrappers (functools.wraps) copy it
        self.program = program  # None: the graph runs eagerly
        self.reason = reason
        self.src = None  # the graph's source, set when serialized
        self._gm = gm
        self._runner = None
        self._loaded = False

    def __call__(self, args: list) -> Any:
        r = self._runner
        if r is None:
            r = self._runner = self._build()
        return r(args)

    def _eager(self):
        from functorch.compile import make_boxed_func

        gm = self._gm if self._gm is not None else _from_source(self.src)
        return make_boxed_func(gm.forward)

    def _build(self):
        if self.program is None:
            return self._eager()
        p = self.program
        cpu_updates = p["cpu_updates"]
        if cpu_updates is not None and not isinstance(cpu_updates[0], torch.fx.GraphModule):
            cpu_updates = (_from_source(cpu_updates[0]),) + tuple(cpu_updates[1:])
        return lower._runner(p, cpu_updates, self._eager)

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        # loaded from AOTAutograd's cache: the runnable is built on the first call
        if not self._loaded:
            self._loaded = True
            lower.stats["graphs_compiled"] += 1
            lower.stats["graphs_loaded"] += 1

    def prepare_for_serialization(self) -> None:
        # called on a shallow copy of the live object, which keeps running
        if self.program is None:
            raise BypassAOTAutogradCache(f"torchtpu: the graph runs eagerly ({self.reason})")
        with unset_fake_temporarily():  # constants are real tensors: copied to the CPU
            self._serialize()

    def _serialize(self) -> None:
        p = dict(self.program)
        p["constants"] = [c.detach().cpu() for c in p["constants"]]
        if p["cpu_updates"] is not None and isinstance(p["cpu_updates"][0], torch.fx.GraphModule):
            p["cpu_updates"] = (_source(p["cpu_updates"][0]),) + tuple(p["cpu_updates"][1:])
        self.program = p
        self.src = _source(self._gm)
        self._gm = None
        self._runner = None

    def __copy__(self):
        c = GraphCode.__new__(GraphCode)
        c.__dict__.update(self.__dict__)
        return c

    def __getstate__(self):
        if self._gm is not None:
            raise BypassAOTAutogradCache("torchtpu: graph not prepared for serialization")
        d = dict(self.__dict__)
        d["_runner"] = None
        return d

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


@contextlib.contextmanager
def aot_cache_scope():
    """Yields whether AOTAutograd's cache is on for this backend call (see the module docstring)."""
    import torch._functorch.config as fconfig

    d = cache.torch_cache_dir()  # torch adds aotautograd/<key>/<entry>
    if not d or not fconfig.enable_autograd_cache or torch.compiler.config.force_disable_caches:
        yield False
        return
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = _fingerprint()
    tag = torch.compiler.config.cache_key_tag
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    try:
        with fconfig.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
                torch.compiler.config.patch(cache_key_tag=f"{tag}|{_FINGERPRINT}" if tag else _FINGERPRINT):
            yield True
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old

