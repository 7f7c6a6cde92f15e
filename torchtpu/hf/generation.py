"""Generation with a compiled forward, a fixed-size static KV cache and bucketed prompts.

XLA compiles one program per shape. Hugging Face's `generate` with
`cache_implementation="static"` keeps the decode step's shapes fixed, but
the prompt length (prefill) and the cache length (prompt + new tokens) still
vary per request. `StaticGenerator` fixes them too:

* prompts are left-padded (pad token, attention mask 0) to the next length
  bucket (default 16, 32, ..., 512), and the batch to the next batch bucket
  (1, 2, 4, 8, 16, ...; extra rows repeat the first row and are dropped);
* the static cache has one size (`max_cache_len`) for every request;
* `model.forward` is compiled with `torch.compile(backend="tpu", dynamic=False)`.

So after one request per (batch bucket, length bucket) the model runs cached
programs only: one prefill program per bucket and one decode program per
batch bucket, zero compiles per new token or per new prompt length within a
bucket. The results are those of `model.generate` on the unpadded batch (the
added padding is masked and removed from the output).

    gen = torchtpu.generation.StaticGenerator(model, max_cache_len=640)
    out = gen.generate(input_ids, attention_mask=mask, max_new_tokens=64)
"""
from __future__ import annotations

import bisect

import torch

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512)


def bucket(n: int, buckets) -> int:
    """The smallest bucket >= n (ValueError past the largest)."""
    i = bisect.bisect_left(buckets, n)
    if i == len(buckets):
        raise ValueError(f"length {n} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def batch_bucket(n: int) -> int:
    """The batch padded to a power of two."""
    if n < 1:
        raise ValueError(f"batch size must be >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def pad_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, pad_token_id: int,
                buckets=DEFAULT_BUCKETS, pad_batch: bool = True):
    """Left-pads a batch of prompts to its length bucket (and its batch to a power of two).

    Returns (input_ids, attention_mask, added columns, original batch size)."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    b, n = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    width = bucket(n, buckets)
    extra = width - n
    if extra:
        input_ids = torch.cat([input_ids.new_full((b, extra), pad_token_id), input_ids], 1)
        attention_mask = torch.cat([attention_mask.new_zeros((b, extra)), attention_mask], 1)
    rows = batch_bucket(b) if pad_batch else b
    if rows > b:
        input_ids = torch.cat([input_ids, input_ids[:1].expand(rows - b, -1)], 0)
        attention_mask = torch.cat([attention_mask, attention_mask[:1].expand(rows - b, -1)], 0)
    return input_ids, attention_mask, extra, b


class StaticGenerator:
    """`model.generate` through cached programs (see the module docstring).

    `model.forward` is replaced by its compiled version (as Hugging Face's
    static-cache recipe does). `max_cache_len` bounds prompt bucket + new
    tokens; it defaults to the largest bucket + 128."""

    def __init__(self, model, *, max_cache_len: int | None = None, buckets=DEFAULT_BUCKETS,
                 pad_batch: bool = True, backend="tpu"):
        from transformers import StaticCache

        self._StaticCache = StaticCache
        self.model = model
        self.buckets = tuple(sorted(buckets))
        if not self.buckets or self.buckets[0] < 1:
            raise ValueError(f"buckets must be positive lengths, got {buckets}")
        self.max_cache_len = max_cache_len or self.buckets[-1] + 128
        self.pad_batch = pad_batch
        pad = model.generation_config.pad_token_id
        if pad is None:
            pad = model.config.pad_token_id if getattr(model.config, "pad_token_id", None) is not None else 0
        self.pad_token_id = pad
        model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
        # one graph per (batch bucket, prefill bucket) and per batch bucket for decode
        self._graphs = 8 * (len(self.buckets) + 1)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int, **kwargs) -> torch.Tensor:
        for k in ("past_key_values", "cache_implementation", "max_length"):
            if k in kwargs:
                raise ValueError(f"StaticGenerator.generate: {k} is set by the generator")
        # padded on the host: on the device, every new prompt length would compile the padding
        device = self.model.device
        ids, mask, extra, b = pad_prompts(input_ids.cpu(), None if attention_mask is None else attention_mask.cpu(),
                                          self.pad_token_id, self.buckets, self.pad_batch)
        ids, mask = ids.to(device), mask.to(device)
        if ids.shape[1] + max_new_tokens > self.max_cache_len:
            raise ValueError(f"prompt bucket {ids.shape[1]} + max_new_tokens {max_new_tokens} exceeds "
                             f"max_cache_len {self.max_cache_len}")
        cache = self._StaticCache(config=self.model.config, max_cache_len=self.max_cache_len)
        limit = max(torch._dynamo.config.recompile_limit, self._graphs)
        with torch._dynamo.config.patch(recompile_limit=limit):
            out = self.model.generate(ids, attention_mask=mask, past_key_values=cache,
                                      max_new_tokens=max_new_tokens, disable_compile=True, **kwargs)
        rows = b * (kwargs.get("num_return_sequences") or 1)  # padded rows come last

        def unpad(seqs):
            # cut on the host: a device slice at a new offset would compile a program per prompt length
            return seqs.cpu()[:rows, extra:].contiguous().to(seqs.device)

        if isinstance(out, torch.Tensor):
            return unpad(out)
        out.sequences = unpad(out.sequences)  # other outputs keep the padded rows
        return out

    def warmup(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
               max_new_tokens: int, **kwargs):
        """One request run under ``torchtpu.warmup()``: every program it needs
        compiles now, so identical requests (same batch and prompt buckets,
        ``max_new_tokens`` and options) afterwards compile nothing. Returns its
        output."""
        from .._modes import warmup

        with warmup():
            return self.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens, **kwargs)
