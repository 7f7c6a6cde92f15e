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
           "llama3_70b_dryrun", "qwen3_8b_dryrun", "qwen3_235b_a22b_dryrun", "RECIPES"]


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


def _llama3_70b(flavor: str) -> Trainer.Config:
    from torchtitan.models.llama3 import config_registry as reg
    from torchtitan.models.llama3 import model_registry

    config = reg.llama3_70b()  # TP 8, seq 8192, local batch 8, AdamW 1.5e-4, c4
    config.model_spec = model_registry(flavor, attn_backend="varlen")
    _loss_for(config, config.model_spec)
    # TP 8 inside a v5p/v6e host's chips, FSDP across hosts
    return _pod(config, tp=8)


def _qwen3_8b(flavor: str) -> Trainer.Config:
    from torchtitan.models.qwen3 import config_registry as reg
    from torchtitan.models.qwen3 import model_registry

    config = reg.qwen3_14b()  # the dense Qwen3 recipe: FSDP, seq 4096, local batch 4
    config.model_spec = model_registry(flavor, attn_backend="varlen")
    config.hf_assets_path = "./assets/hf/Qwen3-8B"
    _loss_for(config, config.model_spec)
    return _pod(config)  # 8B fits FSDP alone (bf16 params + f32 Adam: ~16 B/param sharded)


def _qwen3_235b_a22b(flavor: str) -> Trainer.Config:
    from torchtitan.models.qwen3 import config_registry as reg
    from torchtitan.models.qwen3 import model_registry

    config = reg.qwen3_30b_a3b()  # the MoE Qwen3 recipe: FSDP, seq 4096, local batch 2
    config.model_spec = model_registry(flavor, attn_backend="varlen")
    config.hf_assets_path = "./assets/hf/Qwen3-235B-A22B"
    _loss_for(config, config.model_spec)
    # 128 experts over 8 expert-parallel ranks (16 each), TP 4 for attention
    return _pod(config, tp=4, ep=8)


def llama3_70b() -> Trainer.Config:
    """Llama 3 70B (torchtitan's "70B" flavor), pod recipe: TP 8 x FSDP, full AC, bf16, compiled."""
    return _llama3_70b("70B")


def qwen3_8b() -> Trainer.Config:
    """Qwen3 8B, pod recipe: FSDP, full AC, bf16, compiled."""
    return _qwen3_8b("8B")


def qwen3_235b_a22b() -> Trainer.Config:
    """Qwen3 235B-A22B (MoE, 128 experts, 8 active), pod recipe: EP 8, TP 4, FSDP, full AC, bf16,
    compiled."""
    return _qwen3_235b_a22b("235B-A22B")


def llama3_70b_dryrun() -> Trainer.Config:
    from torchtitan.models.llama3 import model_registry

    return _dryrun(_llama3_70b("70B"), model_registry("debugmodel", attn_backend="varlen"))


def qwen3_8b_dryrun() -> Trainer.Config:
    from torchtitan.models.qwen3 import model_registry

    return _dryrun(_qwen3_8b("8B"), model_registry("debugmodel", attn_backend="varlen"))


def qwen3_235b_a22b_dryrun() -> Trainer.Config:
    from torchtitan.models.qwen3 import model_registry

    return _dryrun(_qwen3_235b_a22b("235B-A22B"), model_registry("debugmodel_moe", attn_backend="varlen"))


# name -> (recipe, its dry run, the published model it reproduces)
RECIPES = {
    "llama3_70b": (llama3_70b, llama3_70b_dryrun, "meta-llama/Llama-3.1-70B"),
    "qwen3_8b": (qwen3_8b, qwen3_8b_dryrun, "Qwen/Qwen3-8B"),
    "qwen3_235b_a22b": (qwen3_235b_a22b, qwen3_235b_a22b_dryrun, "Qwen/Qwen3-235B-A22B"),
}
