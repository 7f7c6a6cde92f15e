"""Decode steps compiled per batch-size bucket for SGLang on "tpu" (the platform's
``get_graph_runner_cls``).

SGLang asks the platform for its decode "graph runner" when ``capabilities.graph_capture`` is
set and ``--disable-cuda-graph`` is not given. Where CUDA captures a CUDA graph per batch size,
this runner compiles one device program per batch-size bucket (SGLang's own
``--cuda-graph-bs-decode`` list, clamped to the request pool), all of them at start-up, so
decode compiles nothing afterwards, whatever the mix of batch sizes:

* a decode batch of ``n`` requests runs in the smallest bucket ``b >= n``: its inputs are padded
  to ``b`` rows (padding requests: request-pool row 0, length 0, KV writes into the reserved
  slot 0); the attention metadata is torchtpu.paged's fixed-shape metadata for ``b`` rows;
* ``TORCHTPU_SGLANG_GRAPH=fuse`` (the default): the step runs in torchtpu's defer_and_fuse mode
  (the platform's default mode for SGLang's model processes): the padding, the metadata, every
  layer with the paged-attention op, the logits and SGLang's sampler are recorded and fused into
  one program per bucket, cached by its structure -- a decode step is 2-3 device programs;
* ``TORCHTPU_SGLANG_GRAPH=compile``: the model's forward through ``torch.compile(backend="tpu")``
  per bucket instead. SGLang 0.5.23's models break Dynamo's graph at every layer boundary
  (``layers/layer_boundary/residual/stream.py:168`` builds a ``Contribution`` through
  ``object.__new__``, which Dynamo refuses; docs/sglang.md), so this gives a program per layer
  and is slower than fuse here.

Prefill and extend batches, and decode batches above the largest bucket, run eagerly (in the
process's mode).
"""
from __future__ import annotations

import bisect
import copy
import os

import torch


def graph_kind() -> str:
    kind = os.environ.get("TORCHTPU_SGLANG_GRAPH", "fuse")
    if kind not in ("fuse", "compile"):
        raise ValueError(f"TORCHTPU_SGLANG_GRAPH must be 'fuse' or 'compile', got {kind!r}")
    return kind


class TpuGraphRunner:
    """SGLang's decode-runner interface (``can_run_graph``, ``execute``, ``capture_bs``)."""

    def __init__(self, model_runner):
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        self.model_runner = model_runner
        self.device = model_runner.device
        if not model_runner.spec_algorithm.is_none():
            raise NotImplementedError("torchtpu's SGLang graph runner: speculative decoding is not supported yet")
        capture_bs, _ = get_batch_sizes_to_capture(model_runner)
        self.capture_bs = sorted(set(capture_bs))
        self.max_bs = self.capture_bs[-1]
        self.bs = None
        self.kind = graph_kind()
        forward = torch.no_grad()(model_runner.model.forward)
        self.forward = (torch.compile(forward, backend="tpu", dynamic=False) if self.kind == "compile"
                        else forward)
        # one Dynamo entry per bucket and graph piece: more than Dynamo's default limit of 8
        self._dynamo_limit = 8 * (len(self.capture_bs) + 1)
        self.capture()

    # ------------------------------------------------------------ capture (compile every bucket)
    def capture(self) -> None:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        mr = self.model_runner
        for bs in reversed(self.capture_bs):
            with torch.device(self.device):
                fb = ForwardBatch(
                    forward_mode=ForwardMode.DECODE, batch_size=bs,
                    input_ids=torch.zeros(bs, dtype=torch.int64),
                    req_pool_indices=torch.zeros(bs, dtype=torch.int64),
                    seq_lens=torch.ones(bs, dtype=torch.int64),
                    out_cache_loc=torch.zeros(bs, dtype=torch.int64),
                    seq_lens_sum=bs, seq_lens_cpu=torch.ones(bs, dtype=torch.int64, device="cpu"),
                    positions=torch.zeros(bs, dtype=torch.int64),
                    return_logprob=False, spec_algorithm=mr.spec_algorithm,
                    capture_hidden_mode=CaptureHiddenMode.NULL, global_forward_mode=ForwardMode.DECODE)
            translator = getattr(mr, "kv_index_translator", None)
            if translator is not None and hasattr(translator, "bind_runner_slots"):
                translator.bind_runner_slots(fb)
            self._run(fb, bs)
        torch.tpu.synchronize()

    # ------------------------------------------------------------ replay
    def can_run_graph(self, forward_batch) -> bool:
        return (forward_batch.forward_mode.is_decode() and forward_batch.batch_size <= self.max_bs
                and forward_batch.spec_info is None)

    def load_batch(self, forward_batch):  # SGLang's speculative paths call it; none run here
        raise NotImplementedError("torchtpu's SGLang graph runner: speculative decoding is not supported yet")

    def execute(self, forward_batch, pp_proxy_tensors=None):
        if pp_proxy_tensors is not None:
            raise NotImplementedError("torchtpu's SGLang graph runner: pipeline parallelism is not supported")
        raw = forward_batch.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw)]
        self.bs = bs
        return self._run(forward_batch, bs, raw)

    def _run(self, fb, bs: int, raw: int | None = None):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        mr = self.model_runner
        raw = fb.batch_size if raw is None else raw
        if bs != raw:
            pad = bs - raw
            padded = copy.copy(fb)
            padded.batch_size = bs
            padded.input_ids = torch.nn.functional.pad(fb.input_ids, (0, pad))
            padded.positions = torch.nn.functional.pad(fb.positions, (0, pad))
            padded.out_cache_loc = torch.nn.functional.pad(fb.out_cache_loc, (0, pad))
            padded.req_pool_indices = torch.nn.functional.pad(fb.req_pool_indices, (0, pad))
            padded.seq_lens = torch.nn.functional.pad(fb.seq_lens, (0, pad))
            if fb.seq_lens_cpu is not None:
                padded.seq_lens_cpu = torch.nn.functional.pad(fb.seq_lens_cpu, (0, pad))
            fb = padded
        mr.attn_backend.init_forward_metadata(fb)
        with forward_context(ForwardContext(attn_backend=mr.attn_backend), forward_batch=fb):
            if self.kind == "compile":
                with torch._dynamo.config.patch(cache_size_limit=self._dynamo_limit):
                    out = self.forward(fb.input_ids, fb.positions, fb)
            else:
                out = self.forward(fb.input_ids, fb.positions, fb)
        if bs == raw:
            return out
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:raw],
            hidden_states=out.hidden_states[:raw] if out.hidden_states is not None else None)
