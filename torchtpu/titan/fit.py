"""Does a release recipe fit on the TPU it is meant for? One rank of it, compiled for that TPU,
with no TPU and no full-size tensor (issue 34: the recipe fit report).

    python -m torchtpu.titan.fit llama3_70b --chips 256 --tpu v5p     (exit status 1: does not fit)

1. **State, exact.** A fake process group of ``--chips`` ranks (torch's ``fake`` backend: no
   communication) lets torchtitan build the recipe's model on the meta device and apply its own
   parallelize function (FSDP, TP, EP, activation checkpointing) as it would on the pod; each
   parameter is then a DTensor whose local shard is what rank 0 holds. Rank 0's parameters,
   gradients and optimizer states (AdamW: two per parameter) in the training dtype are summed.
2. **Programs, compiled for the TPU.** One transformer block at what a rank computes with
   (heads and FFN split by TP, experts by EP, FSDP's shards gathered, the recipe's bf16 compute
   dtype, local batch x sequence length) is traced on the meta device into its forward program
   and its backward program (full activation checkpointing: the backward recomputes the forward,
   one program with both), lowered by torchtpu's compile path (the same lowerings the compiled
   run uses) and compiled by libtpu for the TPU generation: the TPU compiler's own argument,
   output and scratch bytes.
3. **Peak of one chip** (during a block's backward, the largest point of a step under full
   activation checkpointing): state + the block inputs every layer saved + the next block's
   gathered parameters (FSDP prefetch) + the block backward program's arguments, outputs and
   scratch + its gradients cast for the reduce-scatter (``mixed_precision_reduce``).

What the figure leaves out (docs/titan.md): the embedding, final norm, output projection and the
loss (run outside the blocks; the loss is chunked), collective buffers, XLA's fragmentation.
Tensor parallelism's sequence-parallel pieces are taken as one program (the compiled run splits
a block at its collectives): an upper bound. MoE blocks use EP's local experts with the tokens
a balanced router sends them.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field

import torch

__all__ = ["FitReport", "fit", "main"]

_GIB = 1 << 30
# mesh dimensions whose shards a block computes with (FSDP's are gathered before it runs)
_COMPUTE_DIMS = ("tp", "ep", "etp")
# the smallest topology of each generation libtpu compiles one chip's program for
_ONE_CHIP = {"v5e": "v5e:1x1", "v6e": "v6e:1x1", "v5p": "v5p:2x2x1", "v4": "v4:2x2x1",
             "tpu7x": "tpu7x:2x2x1"}


@dataclass
class FitReport:
    recipe: str
    chips: int
    tpu: str
    hbm_bytes: int
    parallelism: dict
    local_batch: int
    seq_len: int
    params_local: int = 0           # rank 0's parameter elements (its shards)
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    saved_activation_bytes: int = 0  # every layer's saved block input (full AC)
    prefetch_bytes: int = 0          # the next block's gathered parameters
    reduce_bytes: int = 0            # one block's gradients in the reduce dtype
    programs: list = field(default_factory=list)  # name, argument/output/temp bytes, seconds

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        bwd = max((p["argument_bytes"] + p["output_bytes"] + p["temp_bytes"] for p in self.programs
                   if p["name"].endswith("backward")), default=0)
        return self.state_bytes + self.saved_activation_bytes + self.prefetch_bytes + bwd + self.reduce_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hbm_bytes

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "state_bytes": self.state_bytes, "peak_bytes": self.peak_bytes,
                "fits": self.fits}

    def __str__(self) -> str:
        g = lambda b: f"{b / _GIB:8.2f} GiB"  # noqa: E731
        par = ", ".join(f"{k} {v}" for k, v in self.parallelism.items())
        lines = [f"{self.recipe} on {self.chips} x {self.tpu} ({g(self.hbm_bytes).strip()} HBM each; {par}; "
                 f"local batch {self.local_batch} x seq {self.seq_len}), one chip:",
                 f"  parameters        {g(self.param_bytes)}  ({self.params_local:,} of rank 0's shards)",
                 f"  gradients         {g(self.grad_bytes)}",
                 f"  optimizer states  {g(self.optimizer_bytes)}",
                 f"  saved activations {g(self.saved_activation_bytes)}  (block inputs, full AC)",
                 f"  next block (FSDP prefetch) {g(self.prefetch_bytes)}",
                 f"  gradients to reduce        {g(self.reduce_bytes)}"]
        for p in self.programs:
            lines.append(f"  {p['name']:<17} arguments {g(p['argument_bytes'])}, outputs {g(p['output_bytes'])}, "
                         f"scratch {g(p['temp_bytes'])}  (libtpu, {p['seconds']:.1f} s)")
        lines.append(f"  peak              {g(self.peak_bytes)} of {g(self.hbm_bytes)}: "
                     + ("fits" if self.fits else "does NOT fit"))
        return "\n".join(lines)


def _fake_world(chips: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_world_size() != chips or dist.get_backend() != "fake":
            raise RuntimeError("torchtpu.titan.fit needs its own process (a fake process group of the "
                               f"recipe's {chips} ranks); this one already has a process group")
        return
    dist.init_process_group(backend="cpu:fake,tpu:fake", store=FakeStore(), rank=0, world_size=chips)


def _set_num_experts(cfg, n: int, old: int | None = None, router: bool = False) -> None:
    """Every ``num_experts`` in a block config tree set to n (EP's local experts), and the
    router's gate width with it."""
    if not dataclasses.is_dataclass(cfg):
        return
    router = router or "Router" in type(cfg).__qualname__
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name, None)
        if f.name == "num_experts" and isinstance(v, int) or (router and f.name == "out_features" and v == old):
            setattr(cfg, f.name, n)
        elif dataclasses.is_dataclass(v):
            _set_num_experts(v, n, old, router)
        elif isinstance(v, (list, tuple)):
            for x in v:
                _set_num_experts(x, n, old, router)


def _compute_shape(p) -> tuple[list[int], int]:
    """A parallelized parameter's shape as the block computes with it (compute dims' shards,
    FSDP's gathered), and the expert count EP leaves this rank (0: not an expert weight)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Shard

    shape = list(p.shape)
    experts = 0
    if isinstance(p, DTensor):
        mesh = p.device_mesh
        for i, pl in enumerate(p.placements):
            if isinstance(pl, Shard) and mesh.mesh_dim_names[i] in _COMPUTE_DIMS:
                shape[pl.dim] //= mesh.size(i)
                if mesh.mesh_dim_names[i] == "ep" and pl.dim == 0:
                    experts = shape[0]
    return shape, experts


def _block_step(block, names, n_params):
    """The block's forward, and the backward program under full AC (the forward again, then
    its backward). Arguments: its parameters then buffers (names), x, [grad,] cu_seq_q, cu_seq_k."""
    from torch.func import functional_call

    def step(*a):
        state, x, grad, masks = a[:len(names)], a[len(names)], a[len(names) + 1], a[len(names) + 2:]
        out = functional_call(block, dict(zip(names, state)), (x, _masks(*masks), None))
        return torch.autograd.grad(out, [*state[:n_params], x], grad)

    def forward(*a):
        state, x, masks = a[:len(names)], a[len(names)], a[len(names) + 1:]
        with torch.no_grad():
            return functional_call(block, dict(zip(names, state)), (x, _masks(*masks), None))

    return step, forward


_MASK_INFO = {}


def _masks(cu_q, cu_k):
    from torchtitan.models.common.attention import VarlenMetadata

    return VarlenMetadata(cu_seq_q=cu_q, cu_seq_k=cu_k, max_q=_MASK_INFO["max"], max_k=_MASK_INFO["max"])


def fit(recipe: str, chips: int, tpu: str = "v5p", local_batch: int | None = None,
        seq_len: int | None = None) -> FitReport:
    """The fit report of a recipe in ``torchtpu.titan``'s registry (``RECIPES``: its LM recipes)
    for ``chips`` chips of TPU generation ``tpu`` (v5e, v5p, v6e, tpu7x). Runs in a process of
    its own (it starts a fake process group)."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.tools import utils

    from .. import aot
    from . import config_registry as reg

    if recipe not in reg.RECIPES or recipe.startswith("flux"):
        raise ValueError(f"torchtpu.titan.fit: recipe must be one of "
                         f"{sorted(r for r in reg.RECIPES if not r.startswith('flux'))}, got {recipe!r}")
    if tpu not in _ONE_CHIP:
        raise ValueError(f"torchtpu.titan.fit: tpu must be one of {sorted(_ONE_CHIP)}, got {tpu!r}")
    if not isinstance(chips, int) or chips < 1:
        raise ValueError(f"torchtpu.titan.fit: chips must be a positive int, got {chips!r}")
    config = reg.RECIPES[recipe][0]()
    if local_batch:
        config.training.local_batch_size = local_batch
    if seq_len:
        config.training.seq_len = seq_len
    tr = config.training
    _fake_world(chips)
    pd = ParallelDims.from_config(config.parallelism, chips)
    pd.build_mesh()
    spec = config.model_spec
    mc = spec.model
    mc.update_from_config(config=config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[tr.dtype]):
        model = mc.build()
    compile_cfg = copy.deepcopy(config.compile)
    compile_cfg.enable = False  # the blocks are traced below, not through Dynamo
    model = spec.parallelize_fn(model, parallel_dims=pd, training=tr, parallelism=config.parallelism,
                                compile_config=compile_cfg, ac_config=config.activation_checkpoint,
                                dump_folder="/tmp")
    par = {"fsdp": pd.dp_shard, "tp": pd.tp, "ep": pd.ep}
    report = FitReport(recipe=recipe, chips=chips, tpu=tpu, hbm_bytes=aot.HBM_BYTES[tpu],
                       parallelism={k: v for k, v in par.items() if v > 1} or {"fsdp": 1},
                       local_batch=tr.local_batch_size, seq_len=tr.seq_len)
    from torch.distributed.tensor import DTensor

    master = TORCH_DTYPE_MAP[tr.dtype]
    for p in model.parameters():
        n = (p.to_local() if isinstance(p, DTensor) else p).numel()
        report.params_local += n
    esize = torch.empty((), dtype=master).element_size()
    report.param_bytes = report.grad_bytes = report.params_local * esize
    opts = {g.optimizer_name for g in config.optimizer.param_groups}
    report.optimizer_bytes = 2 * report.param_bytes if opts <= {"Adam", "AdamW"} else 0

    # one block as rank 0 computes with it
    compute = TORCH_DTYPE_MAP[tr.mixed_precision_param]
    reduce = TORCH_DTYPE_MAP[tr.mixed_precision_reduce]
    layers = list(model.layers.values())
    prefix = next(n for n, _ in model.named_parameters() if n.startswith("layers.")).split(".")[1]
    wrapped = f"layers.{prefix}."
    shapes, experts = {}, 0
    for n, p in model.named_parameters():
        if n.startswith(wrapped):
            name = n[len(wrapped):].replace("_checkpoint_wrapped_module.", "")
            shapes[name], e = _compute_shape(p)
            experts = experts or e
    cfg = copy.deepcopy(mc.layers[0])
    if experts:
        _set_num_experts(cfg, experts, old=experts * pd.ep)
    with torch.device("meta"), utils.set_default_dtype(compute):
        block = cfg.build()
    from torch._subclasses.fake_tensor import FakeTensorMode

    # fake "tpu" tensors: no memory, and the block's autocast regions see the device's type
    fake = FakeTensorMode()
    names, params = [], []
    for n, p in block.named_parameters():
        shape = shapes.get(n, list(p.shape))
        if experts and "router" in n:
            shape = list(p.shape)  # the router over the local experts (see _set_num_experts)
        names.append(n)
        with fake:
            params.append(torch.empty(shape, dtype=compute, device="tpu", requires_grad=True))
    block_param_elems = sum(p.numel() for p in params)
    n_params = len(params)
    for n, buf in block.named_buffers():  # e.g. RoPE's table: a program argument, not a constant
        names.append(n)
        with fake:
            params.append(torch.empty(buf.shape, dtype=buf.dtype, device="tpu"))
    report.prefetch_bytes = block_param_elems * compute.itemsize
    report.reduce_bytes = block_param_elems * reduce.itemsize
    dim = mc.dim
    b, s = tr.local_batch_size, tr.seq_len
    seq_shard = pd.tp if pd.tp > 1 else 1  # sequence parallel between the blocks
    report.saved_activation_bytes = len(layers) * b * (s // seq_shard) * dim * compute.itemsize
    with fake:
        x = torch.empty(b, s, dim, dtype=compute, device="tpu", requires_grad=True)
        grad = torch.empty(b, s, dim, dtype=compute, device="tpu")
        cu = torch.empty(b + 1, dtype=torch.int32, device="tpu")  # one document per sequence
    _MASK_INFO["max"] = s
    step, forward = _block_step(block, names, n_params)
    topology = _ONE_CHIP[tpu]
    for name, text in (("block forward", aot.lower(forward, *[p.detach() for p in params], x.detach(), cu, cu)),
                       ("block backward", aot.lower(step, *params, x, grad, cu, cu))):
        r = aot.compile_text(text, topology)
        if not r["ok"]:
            raise RuntimeError(f"torchtpu.titan.fit: the {name} program of {recipe} does not compile for "
                               f"{tpu}: {r['error'][:2000]}")
        report.programs.append({"name": name, **{k: r[k] for k in ("argument_bytes", "output_bytes",
                                                                    "temp_bytes", "seconds")}})
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torchtpu.titan.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--chips", type=int, required=True, help="chips in the slice (the recipe's world size)")
    ap.add_argument("--tpu", default="v5p", help="TPU generation: " + ", ".join(sorted(_ONE_CHIP)))
    ap.add_argument("--local-batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="the report as one JSON line (bytes)")
    a = ap.parse_args(argv)
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    r = fit(a.recipe, a.chips, a.tpu, a.local_batch, a.seq_len)
    print(json.dumps(r.as_dict()) if a.json else r)
    return 0 if r.fits else 1


if __name__ == "__main__":
    sys.exit(main())
