"""Does a release recipe fit on the TPU it is meant for? One rank of it, compiled for that TPU,
with no TPU and no full-size tensor (issue 34: the recipe fit report).

    python -m torchtpu.titan.fit llama3_70b --chips 256 --tpu v5p     (exit status 1: does not fit)

1. **State, exact.** A fake process group of ``--chips`` ranks (torch's ``fake`` backend: no
   communication) lets torchtitan build the recipe's model on the meta device and apply its own
   parallelize function (FSDP, TP, EP, activation checkpointing) as it would on the pod; each
   parameter is then a DTensor whose local shard is what rank 0 holds. Rank 0's parameters,
   gradients and optimizer states (AdamW: two per parameter) in the training dtype are summed.
2. **Programs, compiled for the TPU.** Each kind of block (a decoder's transformer block;
   FLUX's double- and single-stream blocks) at what a rank computes with (heads and FFN split by
   TP, experts by EP, FSDP's shards gathered, the recipe's bf16 compute dtype, local batch x
   sequence length; FLUX: image patches and T5 tokens) is traced from fake "tpu" tensors into
   its forward program and its backward program (full activation checkpointing: the backward
   recomputes the forward, one program with both), lowered by torchtpu's compile path (the same
   lowerings the compiled run uses) and compiled by libtpu for the TPU generation: the TPU
   compiler's own argument, output and scratch bytes.
3. **Peak of one chip** (during a block's backward, the largest point of a step under full
   activation checkpointing): state + the block inputs every layer saved + the next block's
   gathered parameters (FSDP prefetch) + the block backward program's arguments, outputs and
   scratch + its gradients cast for the reduce-scatter (``mixed_precision_reduce``).

What the figure leaves out (docs/titan.md): the embedding, final norm, output projection and the
loss (run outside the blocks; the loss is chunked), FLUX's frozen encoders and autoencoder,
collective buffers, XLA's fragmentation.
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
            lines.append(f"  {p['name']:<22} arguments {g(p['argument_bytes'])}, outputs {g(p['output_bytes'])}, "
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


@dataclass
class _Block:
    """One kind of block of the model, as rank 0 computes with it."""
    name: str             # "block", "double block", "single block"
    module: torch.nn.Module  # built plain on the meta device
    shapes: dict          # parameter name -> compute shape (absent: the module's own)
    inputs: list          # (shape, dtype, differentiable), in call order
    outputs: list         # shapes of the outputs (their gradients enter the backward)
    call: object          # call(run, ins) -> output(s); run(*args, **kwargs) runs the module
    count: int            # how many of them the model has


def _programs(blk: _Block, compute, fake, topology: str, recipe: str, tpu: str) -> tuple[list, int]:
    """The block's forward program and its backward program under full AC (the forward again,
    then the backward), traced from fake "tpu" tensors and compiled for the TPU; and the
    number of parameter elements of the block."""
    from torch.func import functional_call

    from .. import aot

    names, state = [], []
    with fake:
        for n, p in blk.module.named_parameters():
            names.append(n)
            state.append(torch.empty(blk.shapes.get(n, list(p.shape)), dtype=compute, device="tpu",
                                     requires_grad=True))
        n_params = len(state)
        elems = sum(t.numel() for t in state)
        for n, buf in blk.module.named_buffers():  # e.g. RoPE's table: an argument, not a constant
            names.append(n)
            state.append(torch.empty(buf.shape, dtype=buf.dtype, device="tpu"))
        ins = [torch.empty(sh, dtype=dt, device="tpu", requires_grad=d) for sh, dt, d in blk.inputs]
        grads = [torch.empty(sh, dtype=compute, device="tpu") for sh in blk.outputs]
    ns, ni = len(names), len(ins)
    diff = [i for i, (_, _, d) in enumerate(blk.inputs) if d]

    def runner(st):
        return lambda *a, **k: functional_call(blk.module, dict(zip(names, st)), a, k)

    def forward(*a):
        with torch.no_grad():
            return blk.call(runner(a[:ns]), a[ns:])

    def backward(*a):
        st, xs, gs = a[:ns], a[ns:ns + ni], a[ns + ni:]
        out = blk.call(runner(st), xs)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return torch.autograd.grad(out, [*st[:n_params], *[xs[i] for i in diff]], gs)

    programs = []
    for kind, text in (("forward", aot.lower(forward, *[t.detach() for t in state + ins])),
                       ("backward", aot.lower(backward, *state, *ins, *grads))):
        name = f"{blk.name} {kind}"
        r = aot.compile_text(text, topology)
        if not r["ok"]:
            raise RuntimeError(f"torchtpu.titan.fit: the {name} program of {recipe} does not compile for "
                               f"{tpu}: {r['error'][:2000]}")
        programs.append({"name": name, **{k: r[k] for k in ("argument_bytes", "output_bytes", "temp_bytes",
                                                            "seconds")}})
    return programs, elems


def _masks(cu_q, cu_k, longest: int):
    from torchtitan.models.common.attention import VarlenMetadata

    return VarlenMetadata(cu_seq_q=cu_q, cu_seq_k=cu_k, max_q=longest, max_k=longest)


def _shapes_of(model, prefix: str) -> tuple[dict, int]:
    """Compute shapes of the parallelized block at prefix ("layers.0."), by the plain block's
    parameter names, and the experts EP leaves rank 0."""
    shapes, experts = {}, 0
    for n, p in model.named_parameters():
        if n.startswith(prefix):
            shapes[n[len(prefix):].replace("_checkpoint_wrapped_module.", "")], e = _compute_shape(p)
            experts = experts or e
    return shapes, experts


def _lm_blocks(model, mc, pd, tr, compute, utils) -> list[_Block]:
    """A decoder's transformer block: x [local batch, seq, dim] (sequence-parallel between
    blocks under TP: the block gathers it), one document per sequence."""
    layers = list(model.layers.keys())
    shapes, experts = _shapes_of(model, f"layers.{layers[0]}.")
    cfg = copy.deepcopy(mc.layers[0])
    if experts:
        _set_num_experts(cfg, experts, old=experts * pd.ep)
        # the router over the local experts (see _set_num_experts), not the full one
        shapes = {n: v for n, v in shapes.items() if "router" not in n}
    with torch.device("meta"), utils.set_default_dtype(compute):
        block = cfg.build()
    b, s, dim = tr.local_batch_size, tr.seq_len, mc.dim
    return [_Block("block", block, shapes, [((b, s, dim), compute, True), ((b + 1,), torch.int32, False),
                                            ((b + 1,), torch.int32, False)],
                   [(b, s, dim)], lambda run, ins: run(ins[0], _masks(ins[1], ins[2], s), None), len(layers))]


def _flux_blocks(model, config, tr, compute, utils) -> list[_Block]:
    """FLUX's double-stream and single-stream blocks, with the inputs the model gives them for
    the recipe's image size and T5 length (captured by running the plain model on meta)."""
    from torchtitan.models.flux.trainer import IMAGE_LATENT_SIZE_RATIO, PATCH_HEIGHT, PATCH_WIDTH

    mc = config.model_spec.model
    with torch.device("meta"), utils.set_default_dtype(compute):
        plain = mc.build()
    b = tr.local_batch_size
    side = config.dataloader.img_size // IMAGE_LATENT_SIZE_RATIO
    n_img = (side // PATCH_HEIGHT) * (side // PATCH_WIDTH)
    n_txt = config.tokenizer.max_t5_encoding_len
    seen = {}

    def hook(kind):
        def h(mod, args, kwargs):
            seen[kind] = (args, kwargs)
        return h

    plain.double_blocks[0].register_forward_pre_hook(hook("double"), with_kwargs=True)
    plain.single_blocks[0].register_forward_pre_hook(hook("single"), with_kwargs=True)
    m = lambda *shape: torch.empty(*shape, device="meta", dtype=compute)  # noqa: E731
    with torch.no_grad():
        plain(m(b, n_img, mc.in_channels), m(b, n_img, 3), m(b, n_txt, mc.context_in_dim), m(b, n_txt, 3), m(b),
              m(b, mc.vec_in_dim))
    tr.seq_len = n_img + n_txt
    out = []
    for kind, blocks, prefix in (("double", plain.double_blocks, "double_blocks.0."),
                                 ("single", plain.single_blocks, "single_blocks.0.")):
        args, kwargs = seen[kind]
        keys = [None] * len(args) + list(kwargs)
        vals = list(args) + list(kwargs.values())
        # the residual streams and vec (from trained layers) carry gradients; pe does not
        diffs = [k != "pe" for k in keys]
        outs = [tuple(v.shape) for k, v in zip(keys, vals) if k in (None, "img", "txt")]

        def call(run, ins, keys=keys):
            pos = [x for k, x in zip(keys, ins) if k is None]
            return run(*pos, **{k: x for k, x in zip(keys, ins) if k is not None})

        shapes, _ = _shapes_of(model, prefix)
        out.append(_Block(f"{kind} block", blocks[0], shapes,
                          [(tuple(v.shape), v.dtype, d) for v, d in zip(vals, diffs)], outs, call, len(blocks)))
    return out


def fit(recipe: str, chips: int, tpu: str = "v5p", local_batch: int | None = None,
        seq_len: int | None = None) -> FitReport:
    """The fit report of a recipe in ``torchtpu.titan``'s registry (``RECIPES``, or any of its
    configs) for ``chips``
    chips of TPU generation ``tpu`` (v5e, v5p, v6e, tpu7x). Runs in a process of its own (it
    starts a fake process group). ``seq_len`` applies to the LM recipes (FLUX's comes from its
    image size and T5 length)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.tools import utils

    from .. import aot
    from . import config_registry as reg

    # the release's recipes, or any config of the registry (the debug/test sizes: tests)
    known = sorted(n for n in reg.__all__ if n != "RECIPES" and not n.endswith("_dryrun"))
    if recipe not in known:
        raise ValueError(f"torchtpu.titan.fit: recipe must be one of {sorted(reg.RECIPES)} (or a config of "
                         f"torchtpu.titan's registry: {known}), got {recipe!r}")
    if tpu not in _ONE_CHIP:
        raise ValueError(f"torchtpu.titan.fit: tpu must be one of {sorted(_ONE_CHIP)}, got {tpu!r}")
    if not isinstance(chips, int) or chips < 1:
        raise ValueError(f"torchtpu.titan.fit: chips must be a positive int, got {chips!r}")
    flux = recipe.startswith("flux")
    if flux and seq_len:
        raise ValueError("torchtpu.titan.fit: FLUX's sequence is its image and text tokens; --seq-len is for LMs")
    config = getattr(reg, recipe)()
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
    if not flux:
        mc.update_from_config(config=config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[tr.dtype]):
        model = mc.build()
    compile_cfg = copy.deepcopy(config.compile)
    compile_cfg.enable = False  # the blocks are traced below, not through Dynamo
    model = spec.parallelize_fn(model, parallel_dims=pd, training=tr, parallelism=config.parallelism,
                                compile_config=compile_cfg, ac_config=config.activation_checkpoint,
                                dump_folder="/tmp")
    par = {"fsdp": pd.dp_shard, "tp": pd.tp, "ep": pd.ep}
    params_local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
    esize = TORCH_DTYPE_MAP[tr.dtype].itemsize
    opts = {g.optimizer_name for g in config.optimizer.param_groups}

    compute = TORCH_DTYPE_MAP[tr.mixed_precision_param]
    reduce = TORCH_DTYPE_MAP[tr.mixed_precision_reduce]
    blocks = _flux_blocks(model, config, tr, compute, utils) if flux else _lm_blocks(model, mc, pd, tr, compute, utils)
    report = FitReport(recipe=recipe, chips=chips, tpu=tpu, hbm_bytes=aot.HBM_BYTES[tpu],
                       parallelism={k: v for k, v in par.items() if v > 1} or {"fsdp": 1},
                       local_batch=tr.local_batch_size, seq_len=tr.seq_len, params_local=params_local,
                       param_bytes=params_local * esize, grad_bytes=params_local * esize)
    report.optimizer_bytes = 2 * report.param_bytes if opts <= {"Adam", "AdamW"} else 0
    seq_shard = pd.tp if pd.tp > 1 else 1  # sequence parallel between the blocks
    fake = FakeTensorMode()  # fake "tpu" tensors: no memory; autocast regions see the device type
    largest = 0
    for blk in blocks:
        programs, elems = _programs(blk, compute, fake, _ONE_CHIP[tpu], recipe, tpu)
        report.programs += programs
        largest = max(largest, elems)
        per_block = sum(torch.Size(sh).numel() for sh in blk.outputs) // seq_shard * compute.itemsize
        report.saved_activation_bytes += blk.count * per_block
    report.prefetch_bytes = largest * compute.itemsize
    report.reduce_bytes = largest * reduce.itemsize
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
