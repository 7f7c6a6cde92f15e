"""The release's recipes in torchtpu's torchtitan registry (issue 38): torchtitan builds each
recipe's model on the meta device, and its parameter count must equal the count of the same
published model built by Hugging Face transformers (an independent implementation) from the
model's published config.json values, and the published size. The dry runs, each recipe's code
path at debug size on 2 processes, run here too (a file of their own so that pytest-xdist runs
them beside tests/test_titan.py's runs)."""
from __future__ import annotations

import pytest

pytest.importorskip("torchtitan")
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from test_titan import assets, train  # noqa: E402,F401  (assets: a module fixture)
from torchtpu.titan import config_registry as reg  # noqa: E402

# config.json of each published checkpoint (the fields that decide the parameter count)
PUBLISHED = {
    "llama3_70b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False), 70.55e9),
    "qwen3_8b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False), 8.19e9),
    "qwen3_235b_a22b": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
        num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
        tie_word_embeddings=False), 235.09e9),
}


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _titan_model(config):
    with torch.device("meta"):
        return config.model_spec.model.build()


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_recipe_parameter_count_equals_published_model(name):
    recipe = reg.RECIPES[name][0]()
    titan = _count(_titan_model(recipe))
    cls, fields, published = PUBLISHED[name]
    hf_config = getattr(transformers, cls)(**fields)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    assert titan == _count(hf), (name, titan, _count(hf))
    assert abs(titan - published) / published < 5e-4, (name, titan, published)


def test_moe_recipe_active_parameters():
    """Qwen3 235B-A22B: 22B parameters active per token (8 of 128 experts)."""
    model = _titan_model(reg.RECIPES["qwen3_235b_a22b"][0]())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".routed_experts." in n)
    active = _count(model) - experts + experts * 8 // 128
    assert 21.5e9 < active < 22.5e9, active


def assert_pod_recipe(c) -> None:
    """bf16 parameters with f32 reduction, blocks and loss compiled, full AC, FSDP over every
    chip tensor/expert parallelism leave."""
    assert c.training.mixed_precision_param == "bfloat16"
    assert c.training.mixed_precision_reduce == "float32"
    assert c.compile.enable and set(c.compile.components) == {"model", "loss"}
    assert type(c.activation_checkpoint).__qualname__ == "FullAC.Config"
    assert c.parallelism.data_parallel_shard_degree == -1
    assert c.parallelism.spmd_backend == "partial_dtensor"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_recipe_is_a_pod_recipe(name):
    """What a TPU pod slice runs, as documented in docs/titan.md "Recipes"."""
    recipe, dryrun, _ = reg.RECIPES[name]
    c = recipe()
    assert_pod_recipe(c)
    assert type(c.model_spec.model.layers[0].attention.inner_attention).__qualname__ == "VarlenAttention.Config"
    # the dry run keeps the recipe (its precision, compile, AC) and shrinks only size and degrees
    d = dryrun()
    assert d.training.mixed_precision_param == c.training.mixed_precision_param
    assert d.compile.enable == c.compile.enable
    assert type(d.activation_checkpoint) is type(c.activation_checkpoint)
    assert d.parallelism.tensor_parallel_degree == min(2, c.parallelism.tensor_parallel_degree)
    assert d.parallelism.expert_parallel_degree == min(2, c.parallelism.expert_parallel_degree)
    assert d.model_spec.flavor.startswith("debugmodel")
    assert d.loss.loss_fn.global_vocab_size == d.model_spec.model.vocab_size


@pytest.mark.parametrize("recipe", ["llama3_70b", "qwen3_8b"])
def test_recipe_dry_run(assets, recipe):
    """A release recipe's code path at debug size (``<recipe>_dryrun``: the recipe's bf16
    parameters with f32 reduction, full activation checkpointing, torch.compile of blocks and
    loss, its tensor parallelism shrunk to 2) on 2 processes: trains, every graph compiled."""
    log = []
    run = train(assets, f"dry_{recipe}", 2, 2, config=f"{recipe}_dryrun", env={"PYTHONWARNINGS": "always"},
                log=log)
    assert all(loss == loss and abs(loss) < 20 for loss, _ in run.values()), run
    assert "running this graph eagerly" not in log[0], log[0][-6000:]


def test_fit_report_compiles_one_rank_of_the_70b_recipe_for_a_tpu():
    """torchtpu.titan.fit (issue 34): rank 0 of llama3_70b on 256 v5p chips (FSDP 32 x TP 8),
    at sequence 4096 (the tiled flash attention in the block programs), local batch 1. Its
    state is torchtitan's own sharding on a fake 256-rank world (1/256 of the parameters, to
    the replicated norms); its block programs compile for the TPU."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"):
        pytest.skip("libtpu is not installed (the tpu extra)")
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    r = subprocess.run([sys.executable, "-m", "torchtpu.titan.fit", "llama3_70b", "--chips", "256", "--tpu", "v5p",
                        "--seq-len", "4096", "--local-batch", "1", "--json"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    total = _count(_titan_model(reg.RECIPES["llama3_70b"][0]()))
    assert rep["parallelism"] == {"fsdp": 32, "tp": 8}
    # each weight: 1/256 of it on rank 0; norms (replicated across TP): 1/32
    assert total / 256 <= rep["params_local"] < total / 256 * 1.001
    assert rep["param_bytes"] == rep["grad_bytes"] == 4 * rep["params_local"]
    assert rep["optimizer_bytes"] == 2 * rep["param_bytes"]  # AdamW's two moments
    # 80 layers' saved block inputs: 1 x 4096 / TP 8 tokens of 8192 bf16
    assert rep["saved_activation_bytes"] == 80 * 1 * 512 * 8192 * 2
    fwd, bwd = rep["programs"]
    assert fwd["name"] == "block forward" and bwd["name"] == "block backward"
    # the backward's arguments: the gathered block (TP-local bf16) and x, its gradient
    block = rep["prefetch_bytes"]
    assert bwd["argument_bytes"] >= block + 2 * 4096 * 8192 * 2
    assert bwd["output_bytes"] >= block + 4096 * 8192 * 2
    # tiled flash attention: 0.34 GiB of scratch (libtpu 0.0.51); one 4096-token tile
    # (TORCHTPU_FLASH_TILE=4096, the dense form's footprint) needs 0.84 GiB
    assert 0 < bwd["temp_bytes"] < 512 << 20
    assert rep["fits"] and rep["peak_bytes"] < rep["hbm_bytes"] == 95 << 30


def test_fit_report_of_flux_blocks():
    """FLUX's two kinds of block (double- and single-stream) with the inputs the model gives
    them (image patches and T5 tokens), at flux_testmodel's size: 2 + 2 blocks, 64 px (16
    patches), T5 length 32, FSDP 4 on v5e."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("libtpu") is None and not os.environ.get("TPU_LIBRARY_PATH"):
        pytest.skip("libtpu is not installed (the tpu extra)")
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    r = subprocess.run([sys.executable, "-m", "torchtpu.titan.fit", "flux_testmodel", "--chips", "4", "--tpu", "v5e",
                        "--local-batch", "2", "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    cfg = reg.flux_testmodel()
    total = _count(_titan_model(cfg))
    assert rep["parallelism"] == {"fsdp": 4}
    assert total / 4 <= rep["params_local"] < total / 4 * 1.01
    assert [p["name"] for p in rep["programs"]] == ["double block forward", "double block backward",
                                                     "single block forward", "single block backward"]
    mc = cfg.model_spec.model
    img, txt = (64 // 8 // 2) ** 2, cfg.tokenizer.max_t5_encoding_len
    assert rep["seq_len"] == img + txt
    # saved block inputs: each double block's image and text streams, each single block's joint one
    size = getattr(torch, cfg.training.mixed_precision_param).itemsize  # the compute dtype
    per = 2 * (img + txt) * mc.hidden_size * size
    assert rep["saved_activation_bytes"] == (mc.depth + mc.depth_single_blocks) * per
    dbl = rep["programs"][1]
    assert dbl["output_bytes"] >= per  # gradients of the image and text streams
    assert rep["fits"]
