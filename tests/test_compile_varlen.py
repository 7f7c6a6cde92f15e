"""torch.nn.attention.varlen under torch.compile(backend="tpu") (issue 38).

varlen_attn's custom ops (torch_attn::_varlen_attn and its backward) stay
opaque in compiled graphs; torchtpu lowers them with the flash-attention
lowering eager ops use. max_q / max_k are Python ints that change with each
batch (torchtitan's VarlenMetadata), so Dynamo makes them symbolic graph
inputs after the second value; no lowering reads them, so the graph still
lowers: no eager fallback, no recompile per value. Values and gradients
against per-document SDPA on CPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchtpu

varlen = pytest.importorskip("torch.nn.attention.varlen")

T, H, D = 24, 2, 8


def _ref(q, k, v, cu):
    """Causal attention within each document, per document on CPU (float64)."""
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (x[a:b].double().transpose(0, 1) for x in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
    return torch.cat(outs).float()


def _step(q, k, v, cu, max_q):
    out = varlen.varlen_attn(q, k, v, cu, cu, max_q, max_q, window_size=(-1, 0))
    return out, (out * out).sum()


BATCHES = {
    # three documents each, different lengths (so max_q changes)
    "same_docs": ([0, 5, 12, 24], [0, 9, 15, 24], [0, 3, 13, 24]),
    # the number of documents changes too (torchtitan's packed batches): the offsets get a
    # symbolic length, padded at call time to tokens + 1 (empty documents)
    "docs_vary": ([0, 5, 12, 24], [0, 9, 24], [0, 3, 4, 13, 20, 24], [0, 24]),
}


@pytest.mark.parametrize("batches", sorted(BATCHES))
@pytest.mark.parametrize("grad", [False, True])
def test_compiled_varlen_lowers_with_changing_max_len(grad, batches):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    f = torch.compile(_step, backend="tpu")
    m0 = dict(torchtpu.metrics()["compile"])
    for offs in BATCHES[batches]:
        cu = torch.tensor(offs, dtype=torch.int32)
        max_q = int((cu[1:] - cu[:-1]).max())
        q, k, v = (torch.randn(T, H, D) for _ in range(3))
        qt, kt, vt = (x.to("tpu").requires_grad_(grad) for x in (q, k, v))
        out, loss = f(qt, kt, vt, cu.to("tpu"), max_q)
        torch.testing.assert_close(out.detach().cpu(), _ref(q, k, v, cu), rtol=1e-4, atol=1e-4)
        if grad:
            loss.backward()
            qc, kc, vc = (x.clone().double().requires_grad_(True) for x in (q, k, v))
            r = _ref(qc, kc, vc, cu).double()
            (r * r).sum().backward()
            for got, want in ((qt.grad, qc.grad), (kt.grad, kc.grad), (vt.grad, vc.grad)):
                torch.testing.assert_close(got.cpu(), want.float(), rtol=1e-3, atol=1e-3)
    m = {k: v - m0[k] for k, v in torchtpu.metrics()["compile"].items() if isinstance(v, int)}
    assert m["graph_fallbacks"] == 0, m
    # the first batch compiles with constants, the second makes max_q (and the offsets'
    # length) symbolic, the rest reuse that graph
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    # one program per graph: the padded offsets keep the shapes static
    assert m["graph_lowerings"] <= 2 * (2 if grad else 1), m
