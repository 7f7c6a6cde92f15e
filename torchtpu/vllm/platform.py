"""vLLM ``Platform`` for torchtpu's "tpu" device (an out-of-tree platform, PlatformEnum.OOT).

vLLM resolves it through the ``vllm.platform_plugins`` entry point (``torchtpu.vllm:register``)
in every process it starts (engine core, workers). Everything here uses vLLM's public
extension points: class attributes and classmethods of ``Platform`` and the config objects
handed to ``check_and_update_config``.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

import torchtpu  # noqa: F401  registers the "tpu" device, torch.tpu and the "tpu" c10d backend
from torchtpu import distributed as _tt_dist
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

logger = init_logger(__name__)

WORKER_QUALNAME = "torchtpu.vllm.worker.TpuWorker"
ATTN_BACKEND_QUALNAME = "torchtpu.vllm.attention.TpuPagedAttentionBackend"
DEFAULT_BLOCK_SIZE = 16
_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class TpuPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    # vLLM registers its torch custom ops (unified_attention_with_output, ...) for this key.
    dispatch_key: str = "PrivateUse1"
    ray_device_key: str = "TPU"
    device_control_env_var: str = "TORCHTPU_VISIBLE_DEVICES"
    dist_backend: str = _tt_dist.BACKEND  # "tpu": torchtpu's c10d backend
    # vLLM's small @torch.compile helpers (outside the model) run eagerly; the model's compiled
    # pieces go through get_compile_backend() (torchtpu/vllm/compiler.py).
    simple_compile_backend: str = "eager"
    supported_quantization: list[str] = []
    additional_env_vars: list[str] = ["TORCHTPU_PLUGIN", "TORCHTPU_MEMORY_LIMIT", "TORCHTPU_MODE",
                                      "TORCHTPU_VISIBLE_DEVICES", "TORCHTPU_CACHE_DIR", "TORCHTPU_VLLM_STEP_MODE"]

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return list(_SUPPORTED_DTYPES)

    # ------------------------------------------------------------ device queries
    @classmethod
    def import_kernels(cls) -> None:
        """No vllm._C: every op runs as a torch op on the tpu device."""
        import torchtpu  # noqa: F401

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        """vLLM's core Triton kernels (slot mapping, ...) as torch ops on tpu (torchtpu/vllm/kernels.py)."""
        from vllm.triton_utils.dispatcher import register_kernels

        from . import kernels

        # Once per process: every worker init calls this, and a second scan of sys.modules by
        # vLLM's rebinding (dispatcher.py:139) fails on objects whose vars() is no dict (a
        # second engine in one process: AttributeError '_lib_fn_wrapper' ... 'get'). The first
        # registration rebinds the kernels where they are defined, so later imports get ours.
        if not getattr(kernels, "_registered", False):
            register_kernels(kernels.OVERRIDES)
            kernels._registered = True

    @classmethod
    def check_runner_kv_caches_multi_layer(cls) -> None:
        """A draft model's layers carry the target's layer indices (speculative decoding). The
        runner's flat cache list (``runner.kv_caches``) is only used here to zero freed blocks,
        once per distinct tensor (worker.py ``_zero_block_ids``); each layer's own cache is
        bound by name. So several layers per index are fine, as on CUDA (platforms/cuda.py)."""

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        info = torch.tpu.get_device_properties(device_id)
        return f"{info.platform_name}-{info.device_kind}-{device_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return int(torch.tpu.mem_get_info(device_id)[1])

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        return float(torch.tpu.memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.tpu.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.tpu.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode(mode=True)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in _SUPPORTED_DTYPES:
            raise ValueError(f"torchtpu's vLLM platform does not support dtype {dtype}; "
                             f"supported: {', '.join(str(d) for d in _SUPPORTED_DTYPES)}")

    @classmethod
    def get_punica_wrapper(cls) -> str:
        """LoRA: vLLM's punica wrapper over its pure-torch ops (vllm/lora/ops/torch_ops)."""
        return "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU"

    # ------------------------------------------------------------ compiled steps
    @classmethod
    def get_compile_backend(cls) -> str:
        """vLLM's piecewise compiler for tpu (a ``CompilerInterface``): torchtpu's backend."""
        from .compiler import COMPILER_QUALNAME

        return COMPILER_QUALNAME

    @classmethod
    def support_static_graph_mode(cls) -> bool:
        # vLLM pads each step's token count to a capture size only in a static graph mode:
        # those sizes are the compiled pieces' shape buckets (torchtpu/vllm/compiler.py).
        return True

    @classmethod
    def opaque_attention_op(cls) -> bool:
        # Attention as vLLM's opaque custom ops (unified_attention_with_output,
        # unified_kv_cache_update), the splitting points of the compiled graph. A direct call
        # would be traced into the graph with one step's attention metadata baked in (vLLM
        # drops Dynamo's guards): every later step would attend with the first step's layout.
        return True

    @classmethod
    def graph_pool_handle(cls):
        """vLLM's CUDAGraphWrapper asks for a graph memory pool when built (the runner builds one
        by name for full-graph steps, then replaced by tpu's wrapper, worker.py): there is none."""
        return None

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:
        from .compiler import WRAPPER_QUALNAME

        return WRAPPER_QUALNAME

    @classmethod
    def apply_config_platform_defaults(cls, vllm_config: "VllmConfig") -> None:
        """Shape buckets for compiled steps: powers of two up to ``max_num_batched_tokens``
        (and that count itself), unless the user gave capture sizes. vLLM's CUDA default
        stops at ``2 * max_num_seqs`` tokens and is dense below it; every size above the
        largest bucket would compile a program of its own."""
        cc = vllm_config.compilation_config
        model_config = vllm_config.model_config
        if model_config is None or model_config.enforce_eager:
            return
        if cc.cudagraph_capture_sizes is None and cc.max_cudagraph_capture_size is None:
            max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
            sizes, n = [], 1
            while n < max_tokens:
                sizes.append(n)
                n *= 2
            cc.cudagraph_capture_sizes = sorted(set(sizes + [max_tokens]))
            cc.max_cudagraph_capture_size = max_tokens

    # ------------------------------------------------------------ attention
    @classmethod
    def get_attn_backend_cls(cls, selected_backend: "AttentionBackendEnum",
                             attn_selector_config: "AttentionSelectorConfig",
                             num_heads: int | None = None) -> str:
        cfg = attn_selector_config
        if getattr(cfg, "use_mla", False):
            raise NotImplementedError("torchtpu's vLLM platform: MLA attention is not supported yet")
        if getattr(cfg, "use_sparse", False):
            raise NotImplementedError("torchtpu's vLLM platform: sparse attention is not supported")
        kv_dtype = getattr(cfg, "kv_cache_dtype", None)
        if kv_dtype not in (None, "auto", "float16", "bfloat16", "float32"):
            raise ValueError(f"torchtpu's vLLM platform: kv_cache_dtype {kv_dtype!r} is not supported "
                             "(use 'auto', the model's dtype)")
        from .attention import BACKEND_NAME, ensure_registered

        ensure_registered()
        if selected_backend is not None and getattr(selected_backend, "name", "") != BACKEND_NAME:
            logger.info("torchtpu: attention backend %s is not available on tpu; using %s",
                        selected_backend, ATTN_BACKEND_QUALNAME)
        return ATTN_BACKEND_QUALNAME

    # ------------------------------------------------------------ config
    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        model_config = vllm_config.model_config
        if model_config is not None:
            cls.check_if_supports_dtype(model_config.dtype)

        parallel_config = vllm_config.parallel_config
        if parallel_config.pipeline_parallel_size > 1 or parallel_config.data_parallel_size > 1:
            raise NotImplementedError(
                "torchtpu's vLLM platform: tensor parallelism only for now: "
                f"pipeline_parallel_size={parallel_config.pipeline_parallel_size}, "
                f"data_parallel_size={parallel_config.data_parallel_size} are not supported")
        if parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = WORKER_QUALNAME
        if getattr(parallel_config, "enable_dbo", False):
            parallel_config.enable_dbo = False

        cache_config = vllm_config.cache_config
        if cache_config is not None and not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE

        # The runner reads sampled tokens synchronously: no second stream to overlap with.
        vllm_config.scheduler_config.async_scheduling = False

        cc = vllm_config.compilation_config
        from .compiler import COMPILER_QUALNAME

        if vllm_config.lora_config is not None and cc.mode != CompilationMode.NONE:
            # vLLM's pure-torch punica wrapper (get_punica_wrapper) branches in Python on each
            # step's LoRA metadata (no_lora, prefill/decode, the batch's token counts): a
            # compiled piece would freeze the warm-up's branch (measured: wrong tokens).
            logger.warning("torchtpu's vLLM platform: with LoRA adapters the model runs eager steps "
                           "(vLLM's torch LoRA ops branch on per-step metadata); compilation is off")
            cc.mode = CompilationMode.NONE
        if model_config is None or model_config.enforce_eager or cc.mode == CompilationMode.NONE:
            cc.mode = CompilationMode.NONE
            cc.cudagraph_mode = CUDAGraphMode.NONE
            cc.cudagraph_capture_sizes = []
            cc.max_cudagraph_capture_size = 0
        else:
            if cc.backend in ("", "inductor"):
                # Inductor's vLLM adaptor writes CUDA/Triton kernels: torchtpu compiles the pieces.
                cc.backend = COMPILER_QUALNAME
            if cc.mode in (CompilationMode.STOCK_TORCH_COMPILE, CompilationMode.DYNAMO_TRACE_ONCE) \
                    and cc.backend == COMPILER_QUALNAME:
                cc.backend = "tpu"  # a whole-graph torch.compile: torchtpu's Dynamo backend
            # vLLM's fusion passes rewrite graphs for its CUDA/ROCm kernels (run as Inductor
            # post-grad passes; several import only on CUDA, pass_manager.py:32-52): off.
            pc = cc.pass_config
            for name in type(pc).__dataclass_fields__:
                if (name.startswith("fuse_") or name == "enable_qk_norm_rope_fusion") \
                        and getattr(pc, name) is not False:
                    setattr(pc, name, False)
            if cc.mode == CompilationMode.VLLM_COMPILE:
                # (not splitting_ops: also [] -- a draft model's config is built from this one,
                # and this method runs on it again: it must keep FULL, not turn it PIECEWISE,
                # which vLLM then turns off for the target too, their compilation config shared)
                if not cc.splitting_ops and cc.cudagraph_mode != CUDAGraphMode.NONE:
                    # Full-graph steps: the whole model one graph (no split at attention), its
                    # attention rewritten into torchtpu's paged ops with the step's metadata as
                    # inputs (compiler.py): one program per token bucket.
                    cc.splitting_ops = []
                    cc.cudagraph_mode = CUDAGraphMode.FULL
                elif cc.cudagraph_mode != CUDAGraphMode.NONE:
                    # splitting_ops given: vLLM's piecewise graphs, attention eager between them
                    cc.cudagraph_mode = CUDAGraphMode.PIECEWISE
            else:
                cc.cudagraph_mode = CUDAGraphMode.NONE

        spec = vllm_config.speculative_config
        if spec is not None and spec.use_ngram_gpu():
            # the device n-gram proposer is Triton kernels, CUDA events and a CUDA stream
            # (gpu_model_runner.py:900-908, v1/spec_decode/ngram_proposer_gpu.py)
            raise NotImplementedError(
                "torchtpu's vLLM platform: speculative method 'ngram_gpu' is not supported "
                "(vLLM's device n-gram proposer is CUDA/Triton); use method 'ngram'")

        if cc.mode != CompilationMode.NONE:
            # vLLM's AOT compile cache (compilation/caching.py) stores and reloads Inductor
            # standalone artifacts only: a restart would rebuild the pieces of any other
            # CompilerInterface as None (docs/vllm.md). torchtpu's own persistent caches make
            # restarts cheap instead.
            if os.environ.get("VLLM_USE_AOT_COMPILE") == "1":
                raise ValueError("torchtpu's vLLM platform: VLLM_USE_AOT_COMPILE=1 (vLLM's AOT artifact cache "
                                 "holds Inductor artifacts only) cannot run torchtpu's compiled steps; unset it "
                                 "or pass enforce_eager=True")
            os.environ["VLLM_USE_AOT_COMPILE"] = "0"
        # Model runner V2 needs Triton kernels; ours subclasses the V1 runner.
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        # Workers are started by spawn: a forked child would inherit the parent's PJRT client.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
