"""Model families on torchtpu's vLLM plugin: greedy tokens equal Hugging Face ``generate`` on
CPU (fp32) for tiny Qwen3, Gemma (tied embeddings), Gemma2 and Gemma3 (sliding-window and full
layers alternating, soft caps), Qwen3-MoE and Mixtral built from configs with the local
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


@pytest.mark.parametrize("family", ["qwen3", "gemma", "gemma2", "gemma3", "qwen3_moe", "mixtral"])
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
