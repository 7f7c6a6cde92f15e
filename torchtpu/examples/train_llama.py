"""TorchTitan-style Llama 3 pre-training recipe on the "tpu" device (or CPU/Gloo as the reference).

    torchrun --nproc-per-node 2 -m torchtpu.examples.train_llama --steps 30
    python -m torchtpu.examples.train_llama --device cpu --steps 30       # 1-process CPU reference

The structure follows torchtitan's llama3 trainer (see docs/design.md, "TorchTitan recipe"):

* model: Llama 3 (RMSNorm, RoPE with Llama 3 frequency scaling, GQA attention through
  F.scaled_dot_product_attention(is_causal=True), SwiGLU FFN, untied output head) with torchtitan's
  initialisation (trunc-normal 0.02, depth-scaled output projections, dim**-0.5 head);
  ``--model debugmodel`` is torchtitan's ``llama3 debugmodel`` (dim 256, 6 layers, 16 heads,
  vocab 2048, FFN 768); the default ``tiny`` does a step in a few tens of milliseconds on 2 CPU cores;
* parallelism: ``init_device_mesh(device, (dp,))`` or ``(dp, tp)``; TP with ``parallelize_module``
  (Colwise wq/wk/wv/w1/w3, Rowwise wo/w2) when ``--tp > 1``; FSDP2 ``fully_shard`` on every block
  and on the root, on the dp sub-mesh; a 1-process run is a world of one (FSDP2 over one rank),
  so every run takes the same code path;
* ``--bf16``: FSDP2 ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``;
  ``--ac``: ``torch.utils.checkpoint`` per block; ``--compile``: ``torch.compile`` per block;
* AdamW (torchtitan's betas/eps/weight decay), linear warmup then cosine decay
  (``torch.optim.lr_scheduler.LambdaLR``), gradient-norm clipping across meshes;
* data: synthetic, deterministic tokens (a fixed sparse Markov chain); the global batch of step
  ``s`` depends only on (seed, s), and dp rank r trains rows [r*B/dp, (r+1)*B/dp), so a 2-rank
  run equals a 1-rank run on the concatenated batch and a resumed run sees the same data;
* ``--checkpoint-dir``: DCP save (model, optimizer, scheduler, step) every ``--checkpoint-every``
  steps and at the end; a run resumes from the newest ``step-N`` found there;
* logging: loss, grad norm, lr, tokens/s and MFU per ``--log-every`` steps; MFU = model FLOPs per
  token (6 N + 12 L d T, N without the embedding, as torchtitan) x tokens/s per device / peak;
  the peak comes from ``--peak-tflops``, else a table keyed on the device name (bf16 dense), else
  is measured at start-up with a large f32 matmul on the device (the XLA CPU plugin's case).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------------------- model


@dataclass
class LlamaConfig:
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 16
    n_kv_heads: int | None = None
    vocab_size: int = 2048
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: bool = True  # Llama 3 frequency scaling (factor 8, low 1, high 4, original 8192)
    max_seq_len: int = 2048

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def ffn_hidden(self) -> int:  # torchtitan's compute_ffn_hidden_dim
        h = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            h = int(self.ffn_dim_multiplier * h)
        return self.multiple_of * ((h + self.multiple_of - 1) // self.multiple_of)


MODELS = {
    # torchtitan 0.3.0 torchtitan/models/llama3/__init__.py::_debugmodel (MHA: n_kv_heads unset)
    "debugmodel": LlamaConfig(),
    # torchtitan's debugmodel with GQA (8 kv heads)
    "debugmodel_gqa": LlamaConfig(n_kv_heads=8),
    # small enough for a step well under a second on 2 CPU cores
    "small": LlamaConfig(dim=128, n_layers=4, n_heads=8, n_kv_heads=4, vocab_size=1024, multiple_of=128),
    "tiny": LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, multiple_of=64),
}


def rope_tables(cfg: LlamaConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (seq_len, head_dim/2) of torchtitan's ComplexRoPE (theta, Llama 3 scaling)."""
    d = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    if cfg.rope_scaling:
        factor, low, high, orig = 8.0, 1.0, 4.0, 8192
        wavelen = 2 * math.pi / freqs
        freqs = torch.where(wavelen > orig / low, freqs / factor, freqs)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * freqs / factor + smooth * freqs
        medium = ~(wavelen < orig / high) * ~(wavelen > orig / low)
        freqs = torch.where(medium, smoothed, freqs)
    angles = torch.outer(torch.arange(seq_len).float(), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, T, H, D); rotates adjacent pairs, as torchtitan's complex multiplication does."""
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        # -1 heads: under TP each rank holds n_heads/tp query and kv_heads/tp kv heads
        q = self.wq(x).view(B, T, -1, self.head_dim)
        k = self.wk(x).view(B, T, -1, self.head_dim)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = q.shape[2] // k.shape[2]
        if rep > 1:  # GQA: repeat kv heads (torchtitan's repeat_kv)
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig, seq_len: int):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg, seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.ac = False
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """torchtitan's llama3 initialisation."""
        nn.init.normal_(self.tok_embeddings.weight, std=1.0)
        for i, blk in enumerate(self.layers):
            depth_std = 0.02 / (2 * (i + 1)) ** 0.5
            for lin in (blk.attention.wq, blk.attention.wk, blk.attention.wv, blk.feed_forward.w1):
                nn.init.trunc_normal_(lin.weight, std=0.02)
            for lin in (blk.attention.wo, blk.feed_forward.w2, blk.feed_forward.w3):
                nn.init.trunc_normal_(lin.weight, std=depth_std)
        s = self.cfg.dim ** -0.5
        nn.init.trunc_normal_(self.output.weight, std=s, a=-3 * s, b=3 * s)

    def forward(self, tokens):
        T = tokens.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.ac and torch.is_grad_enabled():
                h = torch.utils.checkpoint.checkpoint(layer, h, cos, sin, use_reentrant=False)
            else:
                h = layer(h, cos, sin)
        return self.output(self.norm(h))


def flops_per_token(model: Llama, seq_len: int) -> tuple[int, int]:
    """(parameters, training FLOPs per token) as torchtitan's get_dense_model_nparams_and_flops."""
    n = sum(p.numel() for p in model.parameters())
    n_emb = model.tok_embeddings.weight.numel()
    c = model.cfg
    return n, 6 * (n - n_emb) + 6 * c.n_layers * c.n_heads * (2 * c.head_dim) * seq_len


# ---------------------------------------------------------------------------------------- data


def global_batch(step: int, batch: int, seq_len: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s (inputs, targets), (batch, seq_len) each: a fixed sparse Markov chain (each
    token has 3 likely successors), sampled from a generator seeded by (seed, step) only."""
    succ = torch.randint(0, vocab, (vocab, 3), generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    choice = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), batch * seq_len, replacement=True,
                               generator=g).view(batch, seq_len)
    toks = torch.empty(batch, seq_len + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
    for t in range(seq_len):
        toks[:, t + 1] = succ[toks[:, t], choice[:, t]]
    return toks[:, :-1], toks[:, 1:]


# ------------------------------------------------------------------------------ peak and timing

# dense bf16 peak FLOP/s per device, keyed on a substring of the lower-cased device name
PEAK_FLOPS = [
    ("v6 lite", 918e12), ("v6e", 918e12), ("v5p", 459e12), ("v5 lite", 197e12), ("v5e", 197e12),
    ("v4", 275e12), ("v3", 123e12), ("v2", 45e12),
    ("h200", 989e12), ("h100", 989e12), ("a100", 312e12), ("l40s", 362e12), ("a10g", 125e12),
]


def _sync(device: torch.device) -> None:
    if device.type == "tpu":
        torch.tpu.synchronize()


def device_name(device: torch.device) -> str:
    if device.type == "tpu":
        import torchtpu

        info = torchtpu._C._device_info()
        return f"{torch.tpu.get_device_name()} ({info['description']})"
    return "cpu"


def measure_matmul_flops(device: torch.device, n: int = 2048, min_seconds: float = 0.5) -> float:
    """f32 (n x n) @ (n x n) on `device`, repeated for at least min_seconds: FLOP/s."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    c = a @ b  # compile / warm up
    _sync(device)
    reps, t0 = 0, time.perf_counter()
    while True:
        c = a @ b
        reps += 1
        _sync(device)
        dt = time.perf_counter() - t0
        if dt >= min_seconds and reps >= 2:
            break
    float(c[0, 0])
    return 2.0 * n ** 3 * reps / dt


def peak_flops(device: torch.device, override_tflops: float | None) -> tuple[float, str]:
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    name = device_name(device).lower()
    if not name.startswith("cpu"):
        for key, v in PEAK_FLOPS:
            if key in name:
                return v, f"table ({key}, bf16 dense)"
    return measure_matmul_flops(device), "measured (f32 2048x2048 matmul)"


# ---------------------------------------------------------------------------------------- train


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """Total 2-norm over gradients that may live on different meshes (FSDP's dp mesh, FSDP+TP's
    2-D mesh) or be plain tensors; scales them in place. Returns the (unclipped) total norm."""
    from torch.distributed.tensor import DTensor

    groups = defaultdict(list)
    for p in params:
        if p.grad is not None:
            groups[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p.grad)
    sq = None
    for grads in groups.values():
        n = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq = n.float() ** 2 if sq is None else sq + n.float() ** 2
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grads in groups.values():
        for g in grads:
            (g._local_tensor if isinstance(g, DTensor) else g).mul_(coef.to(g.dtype))
    return total


def lr_lambda(warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:  # step = number of scheduler.step() calls so far
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def _latest_checkpoint(root: str) -> tuple[int, str] | None:
    if not root or not os.path.isdir(root):
        return None
    found = [(int(m.group(1)), os.path.join(root, d)) for d in os.listdir(root)
             if (m := re.fullmatch(r"step-(\d+)", d)) and os.path.exists(os.path.join(root, d, ".metadata"))]
    return max(found) if found else None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="TorchTitan-style Llama 3 recipe (FSDP2 + optional TP)",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", choices=("tpu", "cpu"), default="tpu",
                    help="cpu: the same recipe on CPU tensors over Gloo (the reference)")
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny",
                    help="debugmodel = torchtitan's llama3 debugmodel")
    ap.add_argument("--dim", type=int)
    ap.add_argument("--n-layers", type=int)
    ap.add_argument("--n-heads", type=int)
    ap.add_argument("--n-kv-heads", type=int)
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences per step, all dp ranks)")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3, help="peak lr (torchtitan's debugmodel: 8e-4)")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine decays to lr * this")
    ap.add_argument("--warmup", type=int, default=2, help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--max-norm", type=float, default=1.0, help="gradient clipping")
    ap.add_argument("--dp", type=int, default=-1, help="data-parallel (FSDP) degree; -1: world / tp")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    ap.add_argument("--bf16", action="store_true",
                    help="FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)")
    ap.add_argument("--ac", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block")
    ap.add_argument("--checkpoint-dir", default="", help="DCP checkpoints step-N here; resume from the newest")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--stop-after", type=int, default=0,
                    help="exit after this many steps of this run (to test resuming; 0: run to --steps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: table, else measured)")
    ap.add_argument("--metrics-json", default="", help="rank 0 writes losses and figures here")
    return ap


def _init_distributed(device: str):
    backend = "tpu" if device == "tpu" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:  # a world of one, so that a 1-process run takes the same FSDP2 code path
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    if args.device == "tpu":
        import torchtpu  # noqa: F401  (registers the device and the "tpu" c10d backend)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank, world = _init_distributed(args.device)
    tp = args.tp
    dp = args.dp if args.dp > 0 else world // tp
    if dp * tp != world:
        raise SystemExit(f"dp {dp} x tp {tp} != world size {world}")
    if args.batch % dp:
        raise SystemExit(f"--batch {args.batch} is not divisible by dp {dp}")
    device = torch.device(args.device)
    if args.device == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()))
    mesh = init_device_mesh(args.device, (dp, tp), mesh_dim_names=("dp", "tp")) if tp > 1 else \
        init_device_mesh(args.device, (dp,), mesh_dim_names=("dp",))
    dp_rank = mesh["dp"].get_local_rank()

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    cfg = MODELS[args.model]
    over = {k: getattr(args, a) for k, a in (("dim", "dim"), ("n_layers", "n_layers"), ("n_heads", "n_heads"),
                                             ("n_kv_heads", "n_kv_heads"), ("vocab_size", "vocab_size"))
            if getattr(args, a) is not None}
    cfg = LlamaConfig(**{**cfg.__dict__, **over})
    if cfg.n_heads % tp or cfg.kv_heads % tp:
        raise SystemExit(f"tp {tp} must divide n_heads {cfg.n_heads} and kv heads {cfg.kv_heads}")

    torch.manual_seed(args.seed)  # same initial weights on every rank and layout
    model = Llama(cfg, args.seq_len)
    nparams, fpt = flops_per_token(model, args.seq_len)
    model = model.to(device)
    model.ac = args.ac
    if tp > 1:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()}
        for blk in model.layers:
            parallelize_module(blk, mesh["tp"], plan)
    if args.compile:
        backend = "tpu" if args.device == "tpu" else "inductor"
        for i, blk in enumerate(model.layers):
            model.layers[i] = torch.compile(blk, backend=backend)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else \
        MixedPrecisionPolicy()
    for blk in model.layers:
        fully_shard(blk, mesh=mesh["dp"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp"], mp_policy=mp)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(args.warmup, args.steps, args.min_lr_ratio))

    start = 0
    ckpt = _latest_checkpoint(args.checkpoint_dir)
    if ckpt is not None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "sched": sched.state_dict(), "train": {"step": 0}}
        dcp.load(state, checkpoint_id=ckpt[1])
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        sched.load_state_dict(state["sched"])
        start = int(state["train"]["step"])
        log(f"resumed from {ckpt[1]} at step {start}")

    # the peak: measured on every rank at once (each rank's share of the host under the CPU plugin)
    peak, peak_src = peak_flops(device, args.peak_tflops)
    t = torch.tensor([peak], device=device)
    dist.all_reduce(t)
    peak = float(t) / world  # the ranks' mean
    log(f"train_llama: {args.model} {cfg}  params {nparams:,}  FLOPs/token {fpt:,}")
    log(f"device {args.device} ({device_name(device)}), world {world}: dp {dp} x tp {tp}, "
        f"bf16 {args.bf16}, ac {args.ac}, compile {args.compile}; global batch {args.batch} x seq {args.seq_len}")
    log(f"peak {peak / 1e9:.1f} GFLOP/s per device ({peak_src})")

    per = args.batch // dp
    end = args.steps if not args.stop_after else min(args.steps, start + args.stop_after)
    losses, pending, figures = {}, [], []
    t_log, tokens_since = time.perf_counter(), 0
    for step in range(start, end):
        x, y = global_batch(step, args.batch, args.seq_len, cfg.vocab_size, args.seed)
        x = x[dp_rank * per:(dp_rank + 1) * per].to(device)
        y = y[dp_rank * per:(dp_rank + 1) * per].to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        gnorm = clip_grad_norm(model.parameters(), args.max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lr = sched.get_last_lr()[0]
        sched.step()
        pending.append((step, loss.detach(), gnorm.detach(), lr))
        tokens_since += args.batch * args.seq_len
        done = step + 1
        if done % args.log_every == 0 or done == end:
            ls = torch.stack([p[1] for p in pending])
            if dp > 1:  # each dp rank's loss is its rows' mean: the global loss is their average
                dist.all_reduce(ls, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group())
            ls = ls.cpu().tolist()
            gn = float(pending[-1][2])
            dt = time.perf_counter() - t_log
            tps = tokens_since / dt  # global tokens/s
            tps_dev = tps / world
            mfu = fpt * tps_dev / peak
            for (s, _, _, _), v in zip(pending, ls):
                losses[s] = v
            figures.append({"step": done, "tokens_per_s": tps, "tokens_per_s_per_device": tps_dev, "mfu": mfu})
            log(f"step {done:4d}  loss {ls[-1]:.4f}  grad_norm {gn:.3f}  lr {pending[-1][3]:.2e}  "
                f"tokens/s {tps:,.0f} ({tps_dev:,.0f}/device)  MFU {100 * mfu:.2f}%")
            pending, tokens_since, t_log = [], 0, time.perf_counter()
        if args.checkpoint_dir and (done % args.checkpoint_every == 0 or done == end):
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict

            msd, osd = get_state_dict(model, opt)
            path = os.path.join(args.checkpoint_dir, f"step-{done}")
            dcp.save({"model": msd, "optim": osd, "sched": sched.state_dict(), "train": {"step": done}},
                     checkpoint_id=path)
            log(f"saved {path}")
    # steady-state figures: the log intervals after the first (which holds the compiles)
    steady = figures[1:] or figures
    summary = {
        "losses": [losses[s] for s in sorted(losses)], "first_step": start,
        "tokens_per_s": sum(f["tokens_per_s"] for f in steady) / len(steady),
        "mfu": sum(f["mfu"] for f in steady) / len(steady),
        "peak_flops": peak, "peak_source": peak_src, "flops_per_token": fpt, "params": nparams,
        "world": world, "dp": dp, "tp": tp, "device": args.device, "intervals": figures,
    }
    if summary["losses"]:
        log(f"loss {summary['losses'][0]:.4f} -> {summary['losses'][-1]:.4f}; steady tokens/s "
            f"{summary['tokens_per_s']:,.0f}, MFU {100 * summary['mfu']:.2f}% of {peak / 1e9:.1f} GFLOP/s/device")
    if rank == 0 and args.metrics_json:
        with open(args.metrics_json, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main()
