"""Sampling outputs on torchtpu's vLLM plugin, one engine, per-prompt SamplingParams: logprobs
(vs Hugging Face CPU log-softmax of the same prefix), stop strings, ``max_tokens``, ``n > 1``
with a seed (reproducible across calls). Skipped without vLLM, like test_vllm_offline.py."""
import os
import sys

import pytest

pytest.importorskip("vllm")
pytest.importorskip("vllm.v1.attention.backend", reason="vLLM is not installed (bash tools/install_vllm.sh)")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny  # noqa: E402
from test_vllm_offline import LLM_KWARGS, PROMPTS, pytestmark, run_llm  # noqa: E402,F401

N_LOGPROBS = 3


def test_logprobs_stop_max_tokens_n_seed(tmp_path):
    import torch

    d = str(tmp_path / "llama")
    model, tok = tiny.make_llama(d)
    prompts = PROMPTS[:4]
    ref = tiny.hf_greedy(model, tok, prompts, 16)
    # a stop string from the middle of prompt 1's greedy text
    full = tok.decode(ref[1])
    start = len(tok.decode(ref[1][:4]))
    stop = next(full[i:i + 2] for i in range(start, len(full) - 1) if full[i:i + 2].strip())
    expected_stop_text = full[:full.find(stop)]
    sampling = [
        dict(temperature=0, max_tokens=8, ignore_eos=True, logprobs=N_LOGPROBS),
        dict(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop]),
        dict(temperature=0, max_tokens=5, ignore_eos=True),
        dict(temperature=1.5, max_tokens=6, ignore_eos=True, n=3, seed=7),
    ]
    res = run_llm(tmp_path, {"model": d, "batches": [prompts, prompts], "llm_kwargs": LLM_KWARGS,
                             "sampling": sampling})
    first, second = res["batches"]
    outs = first["outputs"]

    # logprobs: the sampled token plus the top 3, each close to HF's fp32 log-softmax of its prefix
    lp = outs[0][0]
    assert lp["token_ids"] == ref[0][:8]
    p_ids = first["prompt_token_ids"][0]
    with torch.no_grad():
        logits = model(torch.tensor([p_ids + lp["token_ids"]])).logits[0, len(p_ids) - 1:-1]
    hf_lp = torch.log_softmax(logits.double(), -1)
    assert len(lp["logprobs"]) == 8
    for step, (entries, tok_id) in enumerate(zip(lp["logprobs"], lp["token_ids"])):
        got = {t: (v, r) for t, v, r in entries}
        assert tok_id in got and got[tok_id][1] == 1  # greedy: the sampled token has rank 1
        top = torch.topk(hf_lp[step], N_LOGPROBS).indices.tolist()
        assert set(top) <= set(got), (step, top, got)
        for t, (v, _) in got.items():
            assert abs(v - hf_lp[step, t].item()) < 1e-3, (step, t, v, hf_lp[step, t].item())

    # stop string: the text stops right before it, the tokens are a prefix of the greedy ones
    st = outs[1][0]
    assert st["finish_reason"] == "stop" and st["stop_reason"] == stop, st
    assert st["text"] == expected_stop_text, (st["text"], expected_stop_text, stop)
    assert st["token_ids"] == ref[1][:len(st["token_ids"])] and len(st["token_ids"]) < 16

    # max_tokens
    mt = outs[2][0]
    assert mt["token_ids"] == ref[2][:5] and mt["finish_reason"] == "length"

    # n > 1 with a seed: 3 completions (child seeds seed + i), the same on the second call
    ns = outs[3]
    assert len(ns) == 3 and all(len(c["token_ids"]) == 6 for c in ns)
    assert len({tuple(c["token_ids"]) for c in ns}) > 1, ns
    assert [c["token_ids"] for c in second["outputs"][3]] == [c["token_ids"] for c in ns]
    assert second["outputs"][:3] == first["outputs"][:3]
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]
