"""torchtpu's torch versions of vLLM's core Triton kernels (torchtpu/vllm/kernels.py) on "tpu",
against a per-request Python loop written from the Triton kernels' own code
(vllm/v1/sample/rejection_sampler.py). Needs only torch + torchtpu: runs without vLLM."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import torchtpu  # noqa: E402,F401

from torchtpu.vllm import kernels as K  # noqa: E402

PLACEHOLDER = -1


def _layout(num_draft):
    cu = torch.tensor(num_draft, dtype=torch.int32).cumsum(0).to(torch.int32)
    starts = [0] + cu.tolist()[:-1]
    return cu, starts


def _ref_rejection(out, num_draft, draft, bonus, active, accept_fn, value_fn):
    _, starts = _layout(num_draft)
    for r, n in enumerate(num_draft):
        if not active[r]:
            continue
        rejected = False
        for p in range(n):
            if rejected:
                break
            t = starts[r] + p
            ok = accept_fn(t)
            out[r, p] = value_fn(t, ok)
            rejected = not ok
        if not rejected:
            out[r, n] = bonus[r]
    return out


@pytest.mark.parametrize("with_is_greedy", [False, True])
def test_rejection_greedy_sample(with_is_greedy):
    g = torch.Generator().manual_seed(0)
    num_draft = [3, 0, 2, 3, 1]
    max_spec = 3
    cu, _ = _layout(num_draft)
    n = sum(num_draft)
    vocab = 6
    draft = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32)
    argmax = torch.where(torch.rand(n, generator=g) < 0.6, draft.long(), torch.randint(0, vocab, (n,), generator=g))
    bonus = torch.randint(0, vocab, (len(num_draft), 1), generator=g)
    is_greedy = torch.tensor([True, True, False, True, True]) if with_is_greedy else None
    active = is_greedy.tolist() if with_is_greedy else [True] * len(num_draft)
    ref = _ref_rejection(torch.full((len(num_draft), max_spec + 1), PLACEHOLDER, dtype=torch.int32), num_draft,
                         draft, bonus.view(-1), active, lambda t: int(draft[t]) == int(argmax[t]),
                         lambda t, ok: int(argmax[t]))
    out = torch.full((len(num_draft), max_spec + 1), PLACEHOLDER, dtype=torch.int32, device="tpu")
    K.rejection_greedy_sample(out, cu.to("tpu"), draft.to("tpu"), argmax.to("tpu"), bonus.to("tpu"),
                              None if is_greedy is None else is_greedy.to("tpu"), max_spec, None, None)
    assert torch.equal(out.cpu(), ref), (out.cpu(), ref)


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_rejection_random_sample_and_recovered(with_draft_probs):
    g = torch.Generator().manual_seed(1)
    num_draft = [2, 3, 0, 1]
    max_spec = 3
    cu, starts = _layout(num_draft)
    n, b, vocab = sum(num_draft), len(num_draft), 7
    draft = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32)
    draft[1] = -1  # a padded draft token: always rejected
    target = torch.softmax(torch.randn(n, vocab, generator=g), -1)
    dprobs = torch.softmax(torch.randn(n, vocab, generator=g), -1) if with_draft_probs else None
    uniform = torch.rand(n, generator=g, dtype=torch.float64)
    inv_q = torch.rand(b, vocab, generator=g) + 0.1
    bonus = torch.randint(0, vocab, (b, 1), generator=g)
    is_greedy = torch.tensor([False, False, True, False])

    # recovered tokens: argmax of max(p_t - p_d, 0) (or p_t without the draft token) * inv_q
    rec_ref = torch.empty(n, dtype=torch.int32)
    for r, nd in enumerate(num_draft):
        for p in range(nd):
            t = starts[r] + p
            if dprobs is None:
                prob = target[t].clone()
                prob[max(int(draft[t]), 0)] = 0
            else:
                prob = (target[t] - dprobs[t]).clamp(min=0)
            rec_ref[t] = int((prob * inv_q[r]).argmax())
    rec = torch.zeros(n, dtype=torch.int32, device="tpu")
    K.sample_recovered_tokens(rec, cu.to("tpu"), draft.to("tpu"), None if dprobs is None else dprobs.to("tpu"),
                              target.to("tpu"), inv_q.to("tpu"), vocab, 8192, dprobs is None, False)
    assert torch.equal(rec.cpu(), rec_ref)

    def accept(t):
        d = int(draft[t])
        if d < 0:
            return False
        dp = 1.0 if dprobs is None else float(dprobs[t, d])
        return dp > 0 and float(target[t, d]) / dp >= float(uniform[t])

    ref = _ref_rejection(torch.full((b, max_spec + 1), PLACEHOLDER, dtype=torch.int32), num_draft, draft,
                         bonus.view(-1), (~is_greedy).tolist(), accept,
                         lambda t, ok: int(draft[t]) if ok else int(rec_ref[t]))
    out = torch.full((b, max_spec + 1), PLACEHOLDER, dtype=torch.int32, device="tpu")
    K.rejection_random_sample(out, cu.to("tpu"), draft.to("tpu"), None if dprobs is None else dprobs.to("tpu"),
                              target.to("tpu"), bonus.to("tpu"), rec, uniform.to("tpu"), is_greedy.to("tpu"),
                              max_spec, vocab, None, dprobs is None, False)
    assert torch.equal(out.cpu(), ref), (out.cpu(), ref)
    # some draft tokens were accepted and some rejected: the test exercises both branches
    assert (ref[:, 0] != PLACEHOLDER).any()


def test_expand():
    num = [2, 0, 3, 1]
    cu, starts = _layout(num)
    vals = torch.tensor([5, 7, -1, 9], dtype=torch.int32)
    out = torch.full((sum(num) + 2,), 42, dtype=torch.int32)
    ref = out.clone()
    for r, k in enumerate(num):
        v = int(vals[r])
        ref[starts[r]:starts[r] + k] = 0 if v == -1 else v
    out_t = out.to("tpu")
    K.expand(out_t, vals.to("tpu"), cu.to("tpu"), -1, 0, 4)
    assert torch.equal(out_t.cpu(), ref)


def test_synthetic_mode_is_refused():
    out = torch.zeros(1, 2, dtype=torch.int32, device="tpu")
    one = torch.ones(1, dtype=torch.int32, device="tpu")
    with pytest.raises(NotImplementedError, match="synthetic"):
        K.rejection_greedy_sample(out, one, one, one.long(), one.long().view(1, 1), None, 1,
                                  torch.rand(1, device="tpu"), torch.ones(1, device="tpu"))
