"""Model families on torchtpu's vLLM plugin: greedy tokens equal Hugging Face ``generate`` on
CPU (fp32) for tiny Qwen3, Gemma (tied embeddings), Gemma2 and Gemma3 (sliding-window and full
layers alternating, soft caps), Qwen3-MoE, Mixtral and gpt-oss (attention sinks, expert
biases, clamped SwiGLU) built from configs with the local
tokenizer (tests/vllm/tiny.py). The MoE models run through the plugin's MoE
method (torchtpu/vllm/moe.py). Skipped without vLLM, like test_vllm_offline.py."""
import os
import sys

import pytest

pytest.importorskip("vllm")
pytest.importorskip("vllm.v1.attention.backend", reason="vLLM is not installed (bash tools/install_vllm.sh)")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tiny  # noqa: E402
from test_vllm_offline import GREEDY, LLM_KWARGS, MAX_TOKENS, PROMPTS, pytestmark, run_llm  # noqa: E402,F401


# CI's budget: the variants marked slow run with --runslow (tools/test_vllm.sh --runslow); bf16 is
# also covered by test_vllm_offline.py::test_greedy_bf16_near_hf (Llama) and qwen3_moe here
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("family", ["qwen3", pytest.param("gemma", marks=_SLOW), "gemma2", "gemma3", "qwen3_moe",
                                    "mixtral", "gpt_oss"])
def test_family_greedy_matches_hf_fp32(tmp_path, family):
    d = str(tmp_path / family)
    model, tok = tiny.MODELS[family](d)
    if family == "gemma":
        assert model.config.tie_word_embeddings
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ref = tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)
    assert len({tuple(r) for r in ref}) == len(ref)  # not a degenerate model
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS], "llm_kwargs": LLM_KWARGS, "sampling": GREEDY})
    assert res["platform"] == "TpuPlatform"
    b = res["batches"][0]
    assert b["prompt_token_ids"] == [tok(p)["input_ids"] for p in PROMPTS]
    assert b["token_ids"] == ref
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]


@pytest.mark.parametrize("family", [pytest.param(f, marks=_SLOW) for f in ("qwen3", "gemma", "gemma2", "gemma3")]
                         + ["qwen3_moe", pytest.param("mixtral", marks=_SLOW)])
def test_family_bf16_near_hf(tmp_path, family):
    """bfloat16: each greedy token is a near-argmax (within 0.15) of HF's fp32 logits of its own
    prefix (teacher forcing), as test_vllm_offline.py's bf16 test for Llama."""
    import torch

    d = str(tmp_path / family)
    model, tok = tiny.MODELS[family](d)
    prompts = PROMPTS[:4]
    res = run_llm(tmp_path, {"model": d, "batches": [prompts], "llm_kwargs": dict(LLM_KWARGS, dtype="bfloat16"),
                             "sampling": dict(GREEDY, max_tokens=8)})
    b = res["batches"][0]
    for p_ids, g in zip(b["prompt_token_ids"], b["token_ids"]):
        assert len(g) == 8
        with torch.no_grad():
            logits = model(torch.tensor([p_ids + g])).logits[0, len(p_ids) - 1:-1]
        gap = logits.max(-1).values - logits[torch.arange(len(g)), torch.tensor(g)]
        assert gap.max().item() < 0.15, (gap, logits.std())
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_family_full_graph_matches_hf_fp32(tmp_path, family):
    """Compiled full-graph steps (the platform's default with enforce_eager=False): the model
    one program per bucket, attention torchtpu's paged op inside it with each layer's own
    sliding window and soft cap (Gemma2), attention sinks and experts (gpt-oss). Four token
    buckets, not vLLM's eight (the subject is the graph, not the buckets: test_compiled_steps;
    each gpt-oss bucket is a compile of its own, ~15 s of CI's budget)."""
    d = str(tmp_path / family)
    model, tok = tiny.MODELS[family](d)
    ref = tiny.hf_greedy(model, tok, PROMPTS, MAX_TOKENS)
    cc = {"cudagraph_capture_sizes": [4, 16, 64, 128]}
    res = run_llm(tmp_path, {"model": d, "batches": [PROMPTS],
                             "llm_kwargs": dict(LLM_KWARGS, enforce_eager=False, compilation_config=cc),
                             "sampling": GREEDY})
    assert res["batches"][0]["token_ids"] == ref
    assert res["vllm_compiler"]["full_graphs"] == 1 and res["vllm_compiler"]["pieces"] == 1, res["vllm_compiler"]
    assert res["cpu_fallbacks"] == {}, res["cpu_fallbacks"]
