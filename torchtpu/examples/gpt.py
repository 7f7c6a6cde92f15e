"""A small GPT (nanoGPT-style) used by the demo, the tests and the benchmarks."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.out = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def synthetic_corpus(n_tokens: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Tokens from a fixed random sparse Markov chain: learnable structure, no download."""
    g = torch.Generator().manual_seed(seed)
    # each token has 3 likely successors
    succ = torch.randint(0, vocab, (vocab, 3), generator=g)
    probs = torch.tensor([0.6, 0.3, 0.1])
    out = torch.empty(n_tokens, dtype=torch.long)
    t = 0
    choices = torch.multinomial(probs, n_tokens, replacement=True, generator=g)
    for i in range(n_tokens):
        out[i] = t
        t = int(succ[t, choices[i]])
    return out


def batches(corpus: torch.Tensor, batch: int, block: int, steps: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ix = torch.randint(0, len(corpus) - block - 1, (batch,), generator=g)
        x = torch.stack([corpus[i:i + block] for i in ix])
        y = torch.stack([corpus[i + 1:i + 1 + block] for i in ix])
        yield x, y


def make_model(cfg: GPTConfig | None = None, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg or GPTConfig())


def make_train_step(model: nn.Module, opt: torch.optim.Optimizer, compile: bool = False):
    """One training step (forward, backward, optimizer step) as a function of a batch,
    returning the loss tensor (not read back: the caller decides when to wait).

    With compile=True the model and the optimizer step both go through
    torch.compile(backend="tpu") (forward and backward graphs, one optimizer graph)."""
    fwd = torch.compile(model, backend="tpu") if compile else model
    opt_step = torch.compile(opt.step, backend="tpu") if compile else opt.step

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt_step()
        return loss

    return step


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(cfg: GPTConfig, n_params: int) -> float:
    # 6N for the matmuls + attention (PaLM appendix B)
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


__all__ = ["GPTConfig", "GPT", "synthetic_corpus", "batches", "make_model", "make_train_step", "param_count",
           "flops_per_token", "math"]
