"""SGLang on "tpu": model families, bf16, the radix cache with a long shared prefix, chunked
prefill and a tiny KV pool (queueing, radix-cache eviction), sampling (seeded, top-k/top-p, logprobs, stop strings)
and JSON-schema output, each checked against Hugging Face on CPU or SGLang's own guarantees."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import run_engine

PROMPTS = ["The quick brown fox", "Hello", "Paged attention reads keys and values", "Numbers: 0 1 2"]
GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
ENGINE = dict(dtype="float32", max_total_tokens=2048, max_running_requests=4, mem_fraction_static=0.5,
              random_seed=0, disable_cuda_graph=True, log_level="warning")


@pytest.mark.parametrize("family", ["qwen3", "gemma", "qwen3_moe"])
def test_family_greedy_matches_hf(tmp_path, family):
    """Qwen3 (q/k norms), Gemma (tied embeddings, scaled embeddings, GeGLU) and Qwen3-MoE (4
    experts, top-2): SGLang's own model code on tpu gives HF's greedy tokens, every op native."""
    import tiny

    d = str(tmp_path / family)
    model, tok = getattr(tiny, f"make_{family}")(d)
    ref = tiny.hf_greedy(model, tok, PROMPTS, GREEDY["max_new_tokens"])
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    res, steps = run_engine(tmp_path, {"model": d, "engine": dict(ENGINE, skip_tokenizer_init=True),
                                       "batches": [{"input_ids": ids, "sampling_params": GREEDY}]},
                            mode="defer_and_fuse")
    assert [o["output_ids"] for o in res["batches"][0]] == ref
    assert [r for r in steps if "mode" in r][-1]["cpu_fallbacks"] == {}


def test_bf16_near_hf(tmp_path, llama):
    """bfloat16: rounding may flip a near-tie, so each greedy token is checked against the fp32
    HF logits of its own prefix (teacher forcing): it must be a (near-)argmax."""
    d, model, tok = llama
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    res, _ = run_engine(tmp_path, {"model": d, "engine": dict(ENGINE, dtype="bfloat16", skip_tokenizer_init=True),
                                   "batches": [{"input_ids": ids, "sampling_params": GREEDY}]})
    for p, o in zip(ids, res["batches"][0]):
        g = o["output_ids"]
        assert len(g) == GREEDY["max_new_tokens"]
        with torch.no_grad():
            logits = model(torch.tensor([p + g])).logits[0, len(p) - 1:-1]
        gap = logits.max(-1).values - logits[torch.arange(len(g)), torch.tensor(g)]
        assert gap.max().item() < 0.15, gap


def test_radix_chunked_prefill_and_tiny_pool(tmp_path, llama):
    """One engine with a 128-token KV pool, 16-token prefill chunks and 4 running requests:
    a 60-token shared prefix, requests whose prompts and outputs do not all fit at once (SGLang
    queues them, evicts cached prefixes, retracts a request when decoding runs out of slots) --
    HF's greedy tokens for every request, and a later request sharing the
    prefix reads it from the radix cache (SGLang's cached-token count)."""
    import tiny

    d, model, tok = llama
    shared = tok("Paged attention reads keys and values through a block table. " * 5)["input_ids"][:60]
    tails = [tok(t)["input_ids"] for t in ("The quick brown fox", "Hello world", "A tiny model", "Numbers 1 2")]
    prompts = [shared + t for t in tails]
    sp = dict(GREEDY, max_new_tokens=24)
    ref = [tiny.hf_greedy_ids(model, p, 24) for p in prompts]
    engine = dict(ENGINE, skip_tokenizer_init=True, max_total_tokens=128, chunked_prefill_size=16,
                  max_prefill_tokens=16)
    # SGLang admits requests expecting each to need a fraction (0.7 at first) of its remaining
    # tokens; a small fraction over-admits (decoding may then run out of KV slots and retract)
    res, _ = run_engine(tmp_path, {"model": d, "engine": engine,
                                   "batches": [{"input_ids": prompts[:1], "sampling_params": sp},
                                               {"input_ids": prompts[1:2], "sampling_params": sp},
                                               {"input_ids": prompts, "sampling_params": sp}]},
                        extra_env={"SGLANG_INIT_NEW_TOKEN_RATIO": "0.05", "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR": "0.05"})
    b0, b1, b2 = res["batches"]
    assert b0[0]["output_ids"] == ref[0]
    assert b1[0]["output_ids"] == ref[1]
    assert b1[0]["meta_info"]["cached_tokens"] >= 48, b1[0]["meta_info"]
    assert [o["output_ids"] for o in b2] == ref


def test_sampling_logprobs_stop_and_json(tmp_path, llama):
    """With SGLang's tokenizer: temperature/top-k/top-p sampling reproducible from the engine's
    --random-seed (a second engine, the same seed, the same tokens) and different from greedy
    (a request's sampling_seed needs --enable-deterministic-inference, whose batch-invariant
    kernels are Triton: not on tpu); greedy logprobs (and top-3) equal HF's log-softmax; a stop string
    ends the text before it; a JSON schema (outlines grammar backend) gives valid JSON."""
    import tiny

    d, model, tok = llama
    seeded = {"max_new_tokens": 10, "temperature": 1.0, "top_k": 50, "top_p": 0.9, "ignore_eos": True}
    ids = [tok(p)["input_ids"] for p in PROMPTS[:2]]
    greedy_text = tok.decode(tiny.hf_greedy(model, tok, PROMPTS[:1], 12)[0])
    stop = greedy_text.strip()[4:8]
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    (tmp_path / "again").mkdir()
    again, _ = run_engine(tmp_path / "again", {"model": d, "engine": ENGINE,
                                               "batches": [{"input_ids": ids, "sampling_params": seeded}]},
                          mode="defer_and_fuse")
    res, steps = run_engine(tmp_path, {"model": d, "engine": ENGINE,
                                       "batches": [
        {"input_ids": ids, "sampling_params": seeded},
        {"input_ids": ids, "sampling_params": GREEDY, "return_logprob": True, "top_logprobs_num": 3},
        {"prompt": PROMPTS[:1], "sampling_params": {"max_new_tokens": 12, "temperature": 0, "stop": stop}},
        {"prompt": ["A color:"], "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                       "json_schema": json.dumps(schema)}},
    ]}, mode="defer_and_fuse")
    s1, lp, st, js = res["batches"]
    s2 = again["batches"][0]
    assert [o["output_ids"] for o in s1] == [o["output_ids"] for o in s2]
    ref = tiny.hf_greedy(model, tok, PROMPTS[:2], 12)
    assert [o["output_ids"] for o in s1] != [r[:10] for r in ref]
    for p, o, r in zip(ids, lp, ref):
        assert o["output_ids"] == r
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([p + r])).logits[0, len(p) - 1:-1].double(), -1)
        got = [t[0] for t in o["meta_info"]["output_token_logprobs"]]
        want = logp[torch.arange(len(r)), torch.tensor(r)].tolist()
        assert got == pytest.approx(want, abs=1e-4)
        top = o["meta_info"]["output_top_logprobs"]
        for i, entries in enumerate(top):
            vals = sorted((e[0] for e in entries), reverse=True)
            assert vals == pytest.approx(logp[i].topk(3).values.tolist(), abs=1e-4)
    text = st[0]["text"]
    assert stop not in text and greedy_text.startswith(text), (text, stop, greedy_text)
    assert json.loads(js[0]["text"])["color"] in ("red", "green", "blue"), js[0]["text"]
    assert res["grammar_backend"] == "outlines"
    assert [r for r in steps if "mode" in r][-1]["cpu_fallbacks"] == {}
