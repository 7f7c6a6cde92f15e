"""Speculative decoding in vLLM's offline ``LLM`` on torchtpu's "tpu" platform: n-gram, a draft
model and EAGLE. Speculation must not change a token: greedy output equals Hugging Face's CPU
greedy (which the engine without speculation gives too: test_vllm_offline.py); seeded sampling
reproduces; vLLM's own spec-decode counters show drafts proposed and accepted. Tiny models built
here (no hub)."""
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


def _counters(res):
    c = res["counters"]
    return (c.get("vllm:spec_decode_num_drafts", 0), c.get("vllm:spec_decode_num_draft_tokens", 0),
            c.get("vllm:spec_decode_num_accepted_tokens", 0))


def _init_tail_attrs(statement: str) -> tuple[set, set]:
    """Parsed from vLLM's installed ``GPUModelRunner.__init__``: the ``self.X`` its top-level
    statements assign unconditionally, and those assigned after ``statement`` (at any depth)."""
    import ast
    import inspect
    import textwrap

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    fn = ast.parse(textwrap.dedent(inspect.getsource(GPUModelRunner.__init__.__wrapped__))).body[0]

    def targets(nodes):
        out = set()
        for node in nodes:
            for n in ast.walk(node):
                if isinstance(n, (ast.Assign, ast.AnnAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            out.add(t.attr)
        return out

    top = targets([n for n in fn.body if isinstance(n, (ast.Assign, ast.AnnAssign))])
    lines = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.stmt) and ast.unparse(n).strip() == statement]
    assert lines, f"vLLM's GPUModelRunner.__init__ no longer has {statement!r} (torchtpu/vllm/worker.py)"
    after = [n for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.lineno > lines[0]]
    return top, targets(after)


def test_ngram_tokens_equal_hf(tmp_path, llama, reference):
    """n-gram (vLLM's numba proposer on the host), strict eager steps: greedy requests equal HF's
    CPU greedy (as the engine without speculation does: test_vllm_offline.py); a seeded sampled
    request gives the same tokens in two generate calls; drafts proposed and some accepted on the
    repetitive prompts. The runner built past vLLM's draft-token CUDA stream
    (worker.py ``_finish_init_after_spec_stream``) holds every attribute vLLM's constructor
    assigns, and the constructor's statements after the stream assign exactly what the
    completion assigns: a vLLM release that changes that tail fails here."""
    from torchtpu.vllm.worker import _SPEC_STREAM_STATEMENT, TpuModelRunner

    d, _, _ = llama
    batch = PROMPTS + [PROMPTS[0]]
    sampling = [GREEDY] * len(PROMPTS) + [SEEDED]
    res = run_llm(tmp_path, {"model": d, "batches": [batch, batch], "worker_report": True,
                             "llm_kwargs": dict(STATS, speculative_config=NGRAM), "sampling": sampling})
    for b in res["batches"]:
        assert b["token_ids"][:len(PROMPTS)] == reference
    # seeded sampling: reproducible across calls (the rejection sampler's random path)
    s1, s2 = (b["token_ids"][-1] for b in res["batches"])
    assert s1 == s2 and len(s1) == MAX_TOKENS
    drafts, drafted, accepted = _counters(res)
    assert drafts > 0 and drafted >= drafts and 0 < accepted <= drafted, res["counters"]
    assert res["cpu_fallbacks"] == {}
    top, tail = _init_tail_attrs(_SPEC_STREAM_STATEMENT)
    attrs = set(res["workers"][0]["runner_attrs"])
    assert top <= attrs, top - attrs
    assert SPEC_ONLY_ATTRS <= attrs
    import ast
    import inspect
    import textwrap

    completion = ast.parse(textwrap.dedent(inspect.getsource(TpuModelRunner._finish_init_after_spec_stream)))
    assigned = {t.attr for n in ast.walk(completion) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    # the tail's async-scheduling branch (valid_sampled_token_count_*) does not run here; the
    # completion also sets the stream itself (None)
    assert tail - {"valid_sampled_token_count_event", "valid_sampled_token_count_copy_stream",
                   "valid_sampled_token_count_cpu"} == assigned - {"draft_token_ids_copy_stream"}


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


def test_ngram_gpu_is_refused_by_name(llama):
    """In this process: vLLM's config check asks the platform (no engine started)."""
    from vllm.engine.arg_utils import EngineArgs

    d, _, _ = llama
    args = EngineArgs(model=d, dtype="float32", max_model_len=128, speculative_config=dict(NGRAM, method="ngram_gpu"))
    with pytest.raises(NotImplementedError, match="'ngram_gpu' is not supported"):
        args.create_engine_config()
