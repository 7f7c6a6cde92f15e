"""torchtitan config registry for the tpu device (``--module torchtpu.titan``).

Each function returns torchtitan's own ``Trainer.Config`` for the same model,
built by torchtitan's registry functions, with what the tpu device needs:

* ``attn_backend="varlen"``: torchtitan's language models accept flex,
  flex_flash or varlen; torch's FlexAttention rejects devices other than
  cuda/cpu/xpu/hpu/mps, while varlen calls aten::_flash_attention_forward /
  _backward, which torchtpu lowers natively (ops/attention.cpp).
* ``mixed_precision_param="float32"`` (flag ``--training.mixed_precision_param
  bfloat16`` for bf16). torchtitan's varlen casts q/k/v to bf16 either way.
* ``spmd_backend="partial_dtensor"``: torchtitan's default "spmd_types" needs
  FSDP support for spmd_types annotations that torch 2.14.1's fully_shard
  lacks ("When dp_mesh_dims is provided, all parameters must be DTensors").
* Short sequences and small batches (seq_len 256, local batch 4): attention is
  computed densely over the packed batch.
* CUDA graphs off (torchtitan only warns on other devices).

Every field stays a torchtitan flag (``--training.seq_len 512`` etc.).
"""
from __future__ import annotations

from torchtitan.trainer import Trainer

__all__ = ["llama3_debugmodel", "qwen3_debugmodel", "qwen3_debugmodel_moe",
           "llama3_70b", "qwen3_8b", "qwen3_235b_a22b",
           "llama3_70b_dryrun", "qwen3_8b_dryrun", "qwen3_235b_a22b_dryrun",
           "flux_debugmodel", "flux_testmodel", "flux_dev", "flux_dev_dryrun", "RECIPES"]


def _for_tpu(config: Trainer.Config) -> Trainer.Config:
    config.training.mixed_precision_param = "float32"
    config.training.seq_len = 256
    config.training.local_batch_size = 4
    config.training.disable_cuda_graphs = True
    config.parallelism.spmd_backend = "partial_dtensor"
    return config


def llama3_debugmodel() -> Trainer.Config:
    """torchtitan's llama3_debugmodel (6 layers, dim 256, vocab 2048) with varlen attention."""
    from torchtitan.models.llama3 import config_registry as reg
    from torchtitan.models.llama3 import model_registry

    config = reg.llama3_debugmodel()
    config.model_spec = model_registry("debugmodel", attn_backend="varlen")
    return _for_tpu(config)


def qwen3_debugmodel() -> Trainer.Config:
    """torchtitan's qwen3_debugmodel with varlen attention."""
    from torchtitan.models.qwen3 import config_registry as reg
    from torchtitan.models.qwen3 import model_registry

    config = reg.qwen3_debugmodel()
    config.model_spec = model_registry("debugmodel", attn_backend="varlen")
    return _for_tpu(config)


def qwen3_debugmodel_moe() -> Trainer.Config:
    """qwen3_debugmodel with torchtitan's debug MoE flavor ("debugmodel_moe")."""
    from torchtitan.models.qwen3 import config_registry as reg
    from torchtitan.models.qwen3 import model_registry

    config = reg.qwen3_debugmodel()
    config.model_spec = model_registry("debugmodel_moe", attn_backend="varlen")
    return _for_tpu(config)


# --- The release's recipes (docs/titan.md "Recipes") -----------------------------------------
#
# Each is torchtitan's own recipe for the nearest model (its optimizer, schedule, loss, data,
# checkpointing), with what a TPU pod slice runs: bf16 parameters with f32 gradient reduction
# (FSDP's mixed precision), full activation checkpointing, torch.compile of the blocks and the
# loss (--compile.enable; torchtpu serves torchtitan's Inductor backend), varlen attention, and
# FSDP over every chip not used by tensor or expert parallelism. ``*_dryrun`` runs the same code
# path (the same recipe, parallelism shrunk to 2 processes) on the debug model of the family:
#   torchrun --nproc-per-node 2 -m torchtitan.train --module torchtpu.titan --config llama3_70b_dryrun


def _pod(config: Trainer.Config, *, tp: int = 1, ep: int = 1) -> Trainer.Config:
    from torchtitan.distributed.activation_checkpoint import FullAC

    config.training.mixed_precision_param = "bfloat16"
    config.training.mixed_precision_reduce = "float32"
    config.training.disable_cuda_graphs = True
    config.parallelism.spmd_backend = "partial_dtensor"
    config.parallelism.data_parallel_shard_degree = -1
    config.parallelism.tensor_parallel_degree = tp
    config.parallelism.expert_parallel_degree = ep
    config.activation_checkpoint = FullAC.Config()
    config.compile.enable = True
    config.compile.components = ["model", "loss"]
    return config


def _dryrun(config: Trainer.Config, flavor_spec) -> Trainer.Config:
    """The recipe at debug size on 2 processes: its model family's debug flavor, the local
    assets (python -m torchtpu.titan.assets), short sequences, every parallel degree above 1
    shrunk to 2 (FSDP takes what is left)."""
    config.model_spec = flavor_spec
    _loss_for(config, flavor_spec)
    config.hf_assets_path = "./tests/assets/tokenizer"
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    config.dataloader = HuggingFaceTextDataLoader.Config(dataset="c4_test")
    config.training.seq_len = 128
    config.training.local_batch_size = 2
    config.training.steps = 2
    config.checkpoint.enable = False
    config.validator.enable = False
    config.profiler.enable_profiling = False
    config.metrics.enable_tensorboard = False
    config.metrics.log_freq = 1
    par = config.parallelism
    par.tensor_parallel_degree = min(par.tensor_parallel_degree, 2)
    par.expert_parallel_degree = min(par.expert_parallel_degree, 2)
    return config


def _loss_for(config: Trainer.Config, spec) -> None:
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.models.common.config_utils import decoder_vocab_size

    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(spec)))


def llama3_70b() -> Trainer.Config:
    """Llama 3 70B (torchtitan's "70B" flavor), pod recipe: TP 8 x FSDP, full AC, bf16, compiled."""
    from torchtitan.models.llama3 import config_registry as reg
    from torchtitan.models.llama3 import model_registry

    config = reg.llama3_70b()  # TP 8, seq 8192, local batch 8, AdamW 1.5e-4, c4
    config.model_spec = model_registry("70B", attn_backend="varlen")
    _loss_for(config, config.model_spec)
    # TP 8 inside a v5p/v6e host's chips, FSDP across hosts
    return _pod(config, tp=8)


def qwen3_8b() -> Trainer.Config:
    """Qwen3 8B, pod recipe: FSDP, full AC, bf16, compiled."""
    from torchtitan.models.qwen3 import config_registry as reg
    from torchtitan.models.qwen3 import model_registry

    config = reg.qwen3_14b()  # the dense Qwen3 recipe: FSDP, seq 4096, local batch 4
    config.model_spec = model_registry("8B", attn_backend="varlen")
    config.hf_assets_path = "./assets/hf/Qwen3-8B"
    _loss_for(config, config.model_spec)
    return _pod(config)  # 8B fits FSDP alone (bf16 params + f32 Adam: ~16 B/param sharded)


def qwen3_235b_a22b() -> Trainer.Config:
    """Qwen3 235B-A22B (MoE, 128 experts, 8 active), pod recipe: EP 8, TP 4, FSDP, full AC, bf16,
    compiled."""
    from torchtitan.models.qwen3 import config_registry as reg
    from torchtitan.models.qwen3 import model_registry

    config = reg.qwen3_30b_a3b()  # the MoE Qwen3 recipe: FSDP, seq 4096, local batch 2
    config.model_spec = model_registry("235B-A22B", attn_backend="varlen")
    config.hf_assets_path = "./assets/hf/Qwen3-235B-A22B"
    _loss_for(config, config.model_spec)
    # 128 experts over 8 expert-parallel ranks (16 each), TP 4 for attention
    return _pod(config, tp=4, ep=8)


def llama3_70b_dryrun() -> Trainer.Config:
    from torchtitan.models.llama3 import model_registry

    return _dryrun(llama3_70b(), model_registry("debugmodel", attn_backend="varlen"))


def qwen3_8b_dryrun() -> Trainer.Config:
    from torchtitan.models.qwen3 import model_registry

    return _dryrun(qwen3_8b(), model_registry("debugmodel", attn_backend="varlen"))


def qwen3_235b_a22b_dryrun() -> Trainer.Config:
    from torchtitan.models.qwen3 import model_registry

    return _dryrun(qwen3_235b_a22b(), model_registry("debugmodel_moe", attn_backend="varlen"))


# --- FLUX (torchtitan's FluxTrainer; docs/titan.md "FLUX") -------------------------------------
#
# torchtitan's FLUX configs read T5-XXL and CLIP-L from the hub and a downloaded ae.safetensors.
# Here they read what ``python -m torchtpu.titan.assets`` writes under ./tests/assets (flux/t5,
# flux/clip: tiny encoders at FLUX.1's widths with their tokenizers; flux/ae*.safetensors: random
# autoencoders in FLUX's layout; cc12m_test/*.tar: image-caption pairs).

_ASSETS = "./tests/assets"


def _flux_local(config, autoencoder: str = "ae.safetensors"):
    from torchtpu.titan.flux import from_titan_config

    config = from_titan_config(config)  # torchtpu.titan.flux.FluxTrainer: see its docstring
    flux = f"{_ASSETS}/flux"
    config.hf_assets_path = f"{flux}/t5"
    config.tokenizer.t5_tokenizer_path = config.encoder.t5_encoder = f"{flux}/t5"
    config.tokenizer.clip_tokenizer_path = config.encoder.clip_encoder = f"{flux}/clip"
    config.encoder.autoencoder_path = f"{flux}/{autoencoder}"
    for dl in (config.dataloader, config.validator.dataloader):
        dl.dataset, dl.dataset_path = "cc12m-test", f"{_ASSETS}/cc12m_test"
    config.training.disable_cuda_graphs = True
    config.parallelism.spmd_backend = "partial_dtensor"
    return config


def flux_debugmodel():
    """torchtitan's flux_debugmodel (flux-debug: hidden 1536, 2 + 2 blocks, FLUX's autoencoder)
    on the local assets, fp32."""
    from torchtitan.models.flux import config_registry as reg

    config = _flux_local(reg.flux_debugmodel())
    config.training.mixed_precision_param = "float32"
    return config


def _flux_test_size(config, steps: int = 3):
    from torchtpu.titan.flux_configs import model_spec, test_model

    config = _flux_local(config, autoencoder="ae_test.safetensors")
    config.model_spec = model_spec(test_model(), "flux-test")
    config.tokenizer.max_t5_encoding_len = 32
    config.dataloader.img_size = config.validator.dataloader.img_size = 64
    config.training.local_batch_size = 2
    config.training.steps = steps
    val = config.validator
    val.enable, val.freq, val.steps, val.save_img_count = True, steps, 1, 1
    val.sampling.denoising_steps = 2
    config.checkpoint.interval = steps
    config.metrics.log_freq = 1
    return config


def flux_testmodel():
    """CPU-sized FLUX (torchtpu.titan.flux_configs.test_model: hidden 256, 2 + 2 blocks, a small
    autoencoder), 64 x 64 images, T5 length 32, batch 2, 3 steps, validation with sampling at
    steps 1 and 3: flux_debugmodel's recipe otherwise."""
    from torchtitan.models.flux import config_registry as reg

    config = _flux_test_size(reg.flux_debugmodel())
    config.training.mixed_precision_param = "float32"
    return config


def flux_dev():
    """FLUX.1-dev (12B), pod recipe: FSDP, full AC, bf16, compiled; its encoders from the hub
    paths torchtitan names (google/t5-v1_1-xxl, openai/clip-vit-large-patch14)."""
    from torchtitan.models.flux import config_registry as reg

    from torchtpu.titan.flux import from_titan_config

    # torchtitan's FLUX.1-dev recipe (AdamW 1e-4, 3000 warm-up steps, local batch 32, 256 px,
    # cc12m, full AC, T5 length 512); FSDP over every chip, bf16 params with f32 reduction,
    # the blocks and the loss compiled.
    return _pod(from_titan_config(reg.flux_dev()))


def flux_dev_dryrun():
    """flux_dev's recipe at the test size on the local assets (2 steps, validation off)."""
    config = _flux_test_size(flux_dev(), steps=2)
    config.validator.enable = False
    config.checkpoint.enable = False
    return config


# name -> (recipe, its dry run, the published model it reproduces)
RECIPES = {
    "llama3_70b": (llama3_70b, llama3_70b_dryrun, "meta-llama/Llama-3.1-70B"),
    "qwen3_8b": (qwen3_8b, qwen3_8b_dryrun, "Qwen/Qwen3-8B"),
    "qwen3_235b_a22b": (qwen3_235b_a22b, qwen3_235b_a22b_dryrun, "Qwen/Qwen3-235B-A22B"),
    "flux_dev": (flux_dev, flux_dev_dryrun, "black-forest-labs/FLUX.1-dev"),
}
