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

__all__ = ["llama3_debugmodel", "qwen3_debugmodel", "qwen3_debugmodel_moe"]


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
