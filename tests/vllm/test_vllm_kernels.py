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


# -- the drafters' kernels (vllm/v1/spec_decode/utils.py), each against a loop over its Triton
#    program ids written from the kernel's code


def test_eagle_step_slot_mapping_metadata():
    bs, max_len, nblk, pad = 4, 20, 5, -1
    g = torch.Generator().manual_seed(1)
    table = torch.randint(1, 50, (6, nblk + 2), generator=g, dtype=torch.int32)
    view = table[:, :nblk]  # a strided view, as the proposer passes
    positions = torch.tensor([0, 3, 18, 19, 7], dtype=torch.int64)
    seq_lens = torch.tensor([1, 4, 19, 20, 8], dtype=torch.int32)
    batch, input_batch = 4, 6  # rows 4-5: the launch's padding
    ref_pos = torch.zeros(batch, dtype=torch.int64)
    ref_slot = torch.full((input_batch,), 99, dtype=torch.int64)
    ref_seq = seq_lens.clone()
    for r in range(input_batch):
        if r >= batch:
            ref_slot[r] = pad
            continue
        p = int(positions[r]) + 1
        ex = p >= max_len
        cp = 0 if ex else p
        blk = min(cp // bs, nblk - 1)
        ref_pos[r] = cp
        ref_slot[r] = pad if ex else int(view[r, blk]) * bs + cp % bs
        ref_seq[r] = min(1 if ex else int(seq_lens[r]) + 1, max_len)
    out_pos = torch.zeros(batch, dtype=torch.int64, device="tpu")
    out_slot = torch.full((input_batch,), 99, dtype=torch.int64, device="tpu")
    seq_t = seq_lens.to("tpu")
    K.eagle_step_slot_mapping_metadata(positions.to("tpu"), table.to("tpu")[:, :nblk], table.stride(0), seq_t,
                                       out_pos, out_slot, bs, max_len, nblk, pad, batch)
    assert out_pos.cpu().tolist() == ref_pos.tolist()
    assert out_slot.cpu().tolist() == ref_slot.tolist()
    assert seq_t.cpu().tolist() == ref_seq.tolist()


def test_eagle_prepare_inputs_padded():
    cu = torch.tensor([3, 3, 5, 8, 0], dtype=torch.int32)  # inclusive; row 4 past num_reqs
    valid = torch.tensor([2, 1, 3, 1, 7], dtype=torch.int32)
    qsl = torch.tensor([0, 4, 5, 8, 12, 12], dtype=torch.int32)
    n = 4
    idx_ref, rej_ref = [-7] * 5, [-7] * 5
    for r in range(n):
        nd = int(cu[r]) - (int(cu[r - 1]) if r else 0)
        rej = nd + 1 - int(valid[r]) if nd > 0 else 0
        idx_ref[r], rej_ref[r] = int(qsl[r + 1]) - 1 - rej, rej
    idx = torch.full((5,), -7, dtype=torch.int32, device="tpu")
    rej = torch.full((5,), -7, dtype=torch.int32, device="tpu")
    K.eagle_prepare_inputs_padded(cu.to("tpu"), valid.to("tpu"), qsl.to("tpu"), idx, rej, n)
    assert idx.cpu().tolist() == idx_ref and rej.cpu().tolist() == rej_ref


def test_eagle_prepare_next_token_padded():
    vocab = 10
    sampled = torch.tensor([[3, 4, -1, -1], [-1, -1, -1, -1], [1, 2, 11, -1], [5, 6, 7, 8], [9, 9, 9, 9]],
                           dtype=torch.int32)
    discard = torch.tensor([False, False, False, True, False])
    backup = torch.tensor([40, 41, 42, 43, 44], dtype=torch.int32)
    n, w = 4, 4
    nxt_ref, cnt_ref = [-5] * 5, [-5] * 5
    for r in range(n):
        if discard[r]:
            nxt_ref[r], cnt_ref[r] = int(backup[r]), 0
            continue
        ok = [j for j in range(w) if int(sampled[r, j]) != -1 and int(sampled[r, j]) < vocab]
        cnt_ref[r] = len(ok)
        nxt_ref[r] = int(sampled[r, ok[-1]]) if ok else int(backup[r])
    nxt = torch.full((5,), -5, dtype=torch.int32, device="tpu")
    cnt = torch.full((5,), -5, dtype=torch.int32, device="tpu")
    K.eagle_prepare_next_token_padded(sampled.to("tpu"), discard.to("tpu"), backup.to("tpu"), nxt, cnt, vocab, w, n,
                                      sampled.stride(0), BLOCK_SIZE_TOKENS=4)
    assert nxt.cpu().tolist() == nxt_ref and cnt.cpu().tolist() == cnt_ref


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("slots", [1, 3])
def test_copy_and_expand_eagle_inputs(shift, slots):
    qsl = [0, 4, 7, 8, 12]  # a prefill of 4, decodes with drafts and rejections
    rejected = [0, 1, 0, 2]
    qe = [qsl[r + 1] - 1 - rejected[r] for r in range(4)]
    total_in = qsl[-1]
    g = torch.Generator().manual_seed(2)
    tids = torch.randint(1, 90, (total_in,), generator=g, dtype=torch.int32)
    tpos = torch.arange(total_in, dtype=torch.int64) + 30
    nxt = torch.tensor([91, 92, 93, 94], dtype=torch.int32)
    size = total_in + 4 * slots + 4
    ref = {"ids": [-9] * size, "pos": [-9] * size, "rej": [False] * size, "mask": [False] * size,
           "new": [-9] * (4 * slots), "hid": [-9] * total_in}
    for r in range(4):
        if shift:
            nv, off, start = qe[r] - qsl[r], 1, qsl[r] + r * (slots - 1)
        else:
            nv, off, start = qe[r] - qsl[r] + 1, 0, qsl[r] + r * slots
        total = nv + slots + (qsl[r + 1] - qe[r] - 1)
        for j in range(total):
            o = start + j
            tok = int(tids[min(qsl[r] + off + j, total_in - 1)]) if j < nv else 0
            if j == nv:
                tok = int(nxt[r])
            if nv < j < nv + slots:
                tok = 77
            if j >= nv + slots:
                tok = 0
            ref["ids"][o], ref["pos"][o] = tok, (0 if j >= nv + slots else int(tpos[qsl[r]]) + j)
            ref["rej"][o], ref["mask"][o] = j >= nv + slots, nv < j < nv + slots
            if nv <= j < nv + slots:
                ref["new"][r * slots + j - nv] = o
        if shift:
            for j in range(qsl[r + 1] - qsl[r]):
                ref["hid"][qsl[r] + j] = start + j
    out = {"ids": torch.full((size,), -9, dtype=torch.int32, device="tpu"),
           "pos": torch.full((size,), -9, dtype=torch.int64, device="tpu"),
           "rej": torch.zeros(size, dtype=torch.bool, device="tpu"),
           "mask": torch.zeros(size, dtype=torch.bool, device="tpu"),
           "new": torch.full((4 * slots,), -9, dtype=torch.int32, device="tpu"),
           "hid": torch.full((total_in,), -9, dtype=torch.int32, device="tpu")}
    q = torch.tensor(qsl, dtype=torch.int32, device="tpu")
    K.copy_and_expand_eagle_inputs(tids.to("tpu"), tpos.to("tpu"), nxt.to("tpu"), out["ids"], out["pos"],
                                   out["rej"], out["mask"], out["new"], out["hid"], q,
                                   torch.tensor(qe, dtype=torch.int32, device="tpu"), 0, 77, total_in, slots,
                                   shift, BLOCK_SIZE_TOKENS=8)
    got = {k: v.cpu().tolist() for k, v in out.items()}
    if not shift:
        ref["hid"] = [-9] * total_in
    assert got == ref
