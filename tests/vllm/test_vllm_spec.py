"""Speculative decoding in vLLM's offline ``LLM`` on torchtpu's "tpu" platform: n-gram, a draft
model and EAGLE. Speculation must not change a token: greedy output equals the same engine
without speculation and Hugging Face's CPU greedy; seeded sampling reproduces; vLLM's own
spec-decode counters show drafts proposed and accepted. Tiny models built here (no hub)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_vllm_offline import LLM_KWARGS, _has_entry_point, run_llm  # noqa: E402

import tiny  # noqa: E402

pytestmark = pytest.mark.skipif(not _has_entry_point(), reason="torchtpu's vllm.platform_plugins entry point missing")

MAX_TOKENS = 24
# repetitive text (n-gram lookups hit) and plain prompts, more than max_num_seqs=4
PROMPTS = ["one two three one two three one two three one two", "Hello", "A B C D A B C D A B C",
           "The quick brown fox", "Numbers: 0 1 2 0 1 2 0 1"]
GREEDY = dict(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
SEEDED = dict(temperature=0.8, top_p=0.95, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
STATS = dict(LLM_KWARGS, disable_log_stats=False)  # vLLM's spec-decode counters via LLM.get_metrics
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# what vLLM's runner holds only with speculation (gpu_model_runner.py:598-680): the proposer,
# the rejection sampler and the drafter's context limit
SPEC_ONLY_ATTRS = {"drafter", "rejection_sampler", "effective_drafter_max_model_len"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny-llama-spec"))
    model, tok = tiny.make_llama(d)
    return d, model, tok


@pytest.fixture(scope="module")
def reference(llama):
    d, model, tok = llama
    return tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, llama):
    """The same engine without speculation: its tokens and its runner's attributes."""
    d, _, _ = llama
    return run_llm(tmp_path_factory.mktemp("plain"), {
        "model": d, "batches": [PROMPTS + [PROMPTS[0]]], "worker_report": True, "llm_kwargs": STATS,
        "sampling": [GREEDY] * len(PROMPTS) + [SEEDED]})


def _counters(res):
    c = res["counters"]
    return (c.get("vllm:spec_decode_num_drafts", 0), c.get("vllm:spec_decode_num_draft_tokens", 0),
            c.get("vllm:spec_decode_num_accepted_tokens", 0))


def test_ngram_tokens_equal_plain_and_hf(tmp_path, llama, reference, plain):
    """n-gram (vLLM's numba proposer on the host), strict eager steps: greedy requests equal the
    engine without speculation and HF; a seeded sampled request gives the same tokens in two
    generate calls; drafts are proposed and some accepted on the repetitive prompts. The runner
    built past vLLM's draft-token CUDA stream holds exactly a plain runner's attributes plus the
    speculative ones (worker.py ``_finish_init_after_spec_stream``: a vLLM release that changes the
    constructor's tail fails here)."""
    d, _, _ = llama
    batch = PROMPTS + [PROMPTS[0]]
    sampling = [GREEDY] * len(PROMPTS) + [SEEDED]
    res = run_llm(tmp_path, {"model": d, "batches": [batch, batch], "worker_report": True,
                             "llm_kwargs": dict(STATS, speculative_config=NGRAM), "sampling": sampling})
    plain_tokens = plain["batches"][0]["token_ids"]
    assert plain_tokens[:len(PROMPTS)] == reference
    for b in res["batches"]:
        assert b["token_ids"][:len(PROMPTS)] == reference
    # seeded sampling: reproducible across calls (the rejection sampler's random path)
    s1, s2 = (b["token_ids"][-1] for b in res["batches"])
    assert s1 == s2 and len(s1) == MAX_TOKENS
    drafts, drafted, accepted = _counters(res)
    assert drafts > 0 and drafted >= drafts and 0 < accepted <= drafted, res["counters"]
    assert res["cpu_fallbacks"] == {}
    spec_attrs, plain_attrs = set(res["workers"][0]["runner_attrs"]), set(plain["workers"][0]["runner_attrs"])
    assert plain_attrs - spec_attrs == set()
    assert spec_attrs - plain_attrs == SPEC_ONLY_ATTRS


def test_draft_model_equal_to_target_compiled(tmp_path, llama, reference):
    """A draft model equal to the target, compiled full-graph steps (draft lengths in the token
    buckets): every draft accepted, HF's tokens; no model program compiled after warm-up (the
    drafter's included), and the eager parts have seen every shape by the third call."""
    d, _, _ = llama
    spec = {"method": "draft_model", "model": d, "num_speculative_tokens": 3}
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS] * 3,
                             "llm_kwargs": dict(STATS, enforce_eager=False, speculative_config=spec),
                             "sampling": GREEDY})
    for b in res["batches"]:
        assert b["token_ids"] == reference
    drafts, drafted, accepted = _counters(res)
    assert drafts > 0 and accepted == drafted, res["counters"]
    assert [b["piece_programs"] for b in res["batches"]] == [0, 0, 0]
    assert res["batches"][-1]["compiles"] == 0, [b["compiles"] for b in res["batches"]]
    assert res["cpu_fallbacks"] == {}


def test_eagle_tokens_equal_hf(tmp_path, llama, reference):
    """An EAGLE head (tiny, random, in the layout vLLM's EagleLlamaForCausalLM loads) in
    torchtpu's defer_and_fuse mode: drafts proposed every step, the target's tokens unchanged."""
    d, _, _ = llama
    head = tiny.make_eagle(str(tmp_path / "eagle"), d)
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": 2}
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS],
                             "llm_kwargs": dict(STATS, speculative_config=spec), "sampling": GREEDY},
                  mode="defer_and_fuse")
    assert res["batches"][0]["token_ids"] == reference
    drafts, drafted, accepted = _counters(res)
    assert drafts > 0 and drafted == 2 * drafts, res["counters"]
    assert res["cpu_fallbacks"] == {}


def test_ngram_gpu_is_refused_by_name(tmp_path, llama):
    d, _, _ = llama
    spec = dict(NGRAM, method="ngram_gpu")
    with pytest.raises(AssertionError, match="'ngram_gpu' is not supported"):
        run_llm(tmp_path, {"model": d, "batches": [["Hello"]],
                           "llm_kwargs": dict(LLM_KWARGS, speculative_config=spec), "sampling": GREEDY},
                timeout=240)
