"""vLLM worker and model runner for one tpu device per process.

Both subclass vLLM's v1 GPU classes (``vllm.v1.worker.gpu_worker.Worker`` and
``vllm.v1.worker.gpu_model_runner.GPUModelRunner``) and override only the methods
that name CUDA or rely on vLLM's compiled/Triton kernels; every such spot is listed
in docs/vllm.md. Nothing in vLLM is patched.
"""
from __future__ import annotations

import gc
import os
from contextlib import AbstractContextManager, nullcontext

import torch

import torchtpu  # noqa: F401
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.distributed.parallel_state import get_pp_group
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot, format_gib
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    UniformTypeKVCacheSpecs,
    compute_layer_kv_cache_shape_bytes,
)
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import bind_kv_cache, request_memory
from vllm.v1.worker.worker_base import CompilationTimes

logger = init_logger(__name__)


_SPEC_STREAM_STATEMENT = "self.draft_token_ids_copy_stream = torch.cuda.Stream()"


def _stopped_at(exc: BaseException, statement: str) -> bool:
    """Whether exc was raised by exactly ``statement`` of GPUModelRunner.__init__ (its source
    text, not its line number: a vLLM release that moves it still matches, one that changes it
    does not and the error propagates)."""
    import linecache

    tb, frame = exc.__traceback__, None
    while tb is not None:
        f = tb.tb_frame
        if f.f_code is GPUModelRunner.__init__.__wrapped__.__code__:
            frame = tb
        tb = tb.tb_next
    return frame is not None and linecache.getline(
        frame.tb_frame.f_code.co_filename, frame.tb_lineno).strip() == statement


class TpuModelRunner(GPUModelRunner):
    """vLLM's v1 GPU model runner on a "tpu" device: eager, no CUDA streams or graphs,
    the KV cache as one plain tpu tensor per layer."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        if vllm_config.scheduler_config.async_scheduling:
            raise ValueError("torchtpu: async scheduling needs a copy stream; the platform turns it off")
        try:
            super().__init__(vllm_config, device)
        except RuntimeError as e:
            # Speculative decoding: vLLM's constructor builds a CUDA stream for the draft-token
            # copy (gpu_model_runner.py:933, the one torch.cuda statement on this path with
            # async scheduling off). Where it stops there, the statements after it run below.
            if not _stopped_at(e, _SPEC_STREAM_STATEMENT):
                raise
            self._finish_init_after_spec_stream()
        assert device.type == "tpu", device
        from .sampler import TpuTopKTopPSampler

        # Seeded requests: see torchtpu/vllm/sampler.py (exponential_ with a generator).
        self.sampler.topk_topp_sampler = TpuTopKTopPSampler(self.sampler.logprobs_mode,
                                                            self.sampler.use_fp64_gumbel)

    def _finish_init_after_spec_stream(self) -> None:
        """The rest of ``GPUModelRunner.__init__`` after its draft-token copy stream
        (vLLM 0.33 gpu_model_runner.py:934-960; tests/vllm/test_vllm_spec.py checks that a
        speculative runner has exactly a plain runner's attributes plus the speculative ones).
        The copy is synchronous here (``_copy_draft_token_ids_to_cpu`` below): no stream."""
        from vllm.model_executor.offloader import create_offloader, set_offloader

        assert not self.use_async_scheduling  # lines 940-948 build async copies: not here
        self.draft_token_ids_copy_stream = None
        self.draft_token_ids_cpu = torch.empty((self.max_num_reqs, self.num_spec_tokens),
                                               dtype=torch.int64, device="cpu")
        set_offloader(create_offloader(self.offload_config))
        self.execute_model_state = None
        self.kv_connector_output = None
        self.mamba_state_idx = {}
        self._mamba_bufs = None
        self._mamba_state_copy_funcs = None
        self.layerwise_nvtx_hooks_registered = False

    def _copy_draft_token_ids_to_cpu(self, scheduler_output, zeros_only: bool = False) -> None:
        # GPUModelRunner's version copies on its CUDA stream (gpu_model_runner.py:4599-4634);
        # here the device->host read is synchronous, the event recorded after it as there.
        if torch.is_tensor(self._draft_token_ids):
            self.prev_num_spec_tokens = self._draft_token_ids.shape[1]
        self._draft_token_req_ids = self.input_batch.req_ids.copy()
        draft = self._draft_token_ids
        if not torch.is_tensor(draft):
            return
        rows, k = draft.shape
        if zeros_only:
            self.draft_token_ids_cpu[:rows, :k] = 0
        else:
            self.draft_token_ids_cpu[:rows, :k].copy_(draft)
        self.draft_token_ids_event.record()

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        # Full-graph steps: vLLM's runner wraps the model in its CUDAGraphWrapper by name
        # (gpu_model_runner.py load_model), which captures CUDA graphs; tpu's wrapper
        # (compiler.TpuGraphWrapper, a subclass) calls the model's compiled program instead.
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        from .compiler import TpuGraphWrapper

        if type(self.model) is CUDAGraphWrapper:
            self.model = TpuGraphWrapper(self.model.runnable, self.vllm_config, self.model.runtime_mode)

    # -- compiled steps: the runner's eager work around the model program, fused
    def _step_scope(self) -> AbstractContextManager:
        """Full-graph steps run the runner's eager work (input preparation, the slot mapping,
        logits and the sampler) in torchtpu's defer_and_fuse mode: a decode step is the model's
        program plus two fused ones, not dozens of op programs. ``TORCHTPU_VLLM_STEP_MODE``
        names another mode; torchtpu's debug mode stays debug."""
        if self.compilation_config.cudagraph_mode != CUDAGraphMode.FULL:
            return nullcontext()
        mode = os.environ.get("TORCHTPU_VLLM_STEP_MODE") or (
            "debug" if torchtpu.get_mode() == "debug" else "defer_and_fuse")
        return torchtpu.mode(mode)

    def execute_model(self, *args, **kwargs):
        # One scope over a step's two calls (the model, then sample_tokens with the logits and
        # the sampler): leaving a mode flushes, so the work after the model program and the
        # sampler fuse into one program. execute_model returns its output itself (no
        # sample_tokens follows) for steps without sampling.
        left = getattr(self, "_open_step_scope", None)
        if left is not None:  # a step whose sample_tokens never came (an error in between)
            self._open_step_scope = None
            left.__exit__(None, None, None)
        scope = self._step_scope()
        scope.__enter__()
        try:
            out = super().execute_model(*args, **kwargs)
        except BaseException:
            scope.__exit__(None, None, None)
            raise
        if out is None:
            self._open_step_scope = scope
        else:
            scope.__exit__(None, None, None)
        return out

    def sample_tokens(self, *args, **kwargs):
        scope, self._open_step_scope = getattr(self, "_open_step_scope", None), None
        if scope is None:
            scope = self._step_scope()
            scope.__enter__()
        try:
            return super().sample_tokens(*args, **kwargs)
        finally:
            scope.__exit__(None, None, None)

    # -- host/device synchronisation (the GPU runner uses torch.accelerator / pinned buffers + events)
    def _sync_device(self) -> None:
        torch.tpu.synchronize()

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        # The GPU runner copies into a pinned buffer and waits on a CUDA event
        # (gpu_model_runner.py _to_list); a device->host read is synchronous here.
        return sampled_token_ids.tolist()

    # -- KV cache: one plain tensor per layer, [num_blocks, block_size, kv_heads, k|v] in memory,
    #    bound as the logical [B, H, N, C] view vLLM expects (layout LBNHC)
    def initialize_kv_cache_tensors(
        self,
        kv_cache_config: KVCacheConfig,
        kernel_block_sizes: list[int],
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> dict[str, torch.Tensor]:
        kv_caches: dict[str, torch.Tensor] = {}
        with kv_cache_allocation_context or nullcontext():
            for tensor in kv_cache_config.kv_cache_tensors:
                num_blocks = kv_cache_config.num_blocks_of(tensor)
                for layer_name in tensor.layers:
                    gid, group = next((i, g) for i, g in enumerate(kv_cache_config.kv_cache_groups)
                                      if layer_name in g.layer_names)
                    spec = group.kv_cache_spec
                    if isinstance(spec, UniformTypeKVCacheSpecs):
                        spec = spec.kv_cache_specs[layer_name]
                    if not isinstance(spec, AttentionSpec) or not spec.has_layer_views:
                        raise NotImplementedError(
                            f"torchtpu's vLLM runner: KV cache spec {type(spec).__name__} of layer "
                            f"{layer_name} (Mamba/linear attention state) is not supported yet")
                    kbs = kernel_block_sizes[gid] if gid < len(kernel_block_sizes) else None
                    b, h, n, c_bytes = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kbs)
                    itemsize = torch.empty((), dtype=spec.dtype).element_size()
                    assert c_bytes % itemsize == 0, (c_bytes, spec.dtype)
                    base = torch.zeros((b, n, h, c_bytes // itemsize), dtype=spec.dtype, device=self.device)
                    kv_caches[layer_name] = base.permute(0, 2, 1, 3)
        for layer_name, target in self.shared_kv_cache_layers.items():
            kv_caches[layer_name] = kv_caches[target]
        num_attn_module = 2 if self.model_config.hf_config.model_type == "longcat_flash" else 1
        bind_kv_cache(kv_caches, self.compilation_config.static_forward_context, self.kv_caches,
                      num_attn_module, kv_cache_groups=kv_cache_config.kv_cache_groups)
        return kv_caches

    def _init_kv_zero_meta(self) -> None:
        # The GPU runner's KVBlockZeroer launches a Triton kernel on raw addresses.
        self._tpu_zero_layers = [kv for kv in self.kv_caches if isinstance(kv, torch.Tensor)]

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        if not block_ids:
            return
        idx = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        seen: set[int] = set()
        for kv in self.kv_caches:
            if not isinstance(kv, torch.Tensor) or id(kv) in seen:
                continue
            seen.add(id(kv))
            kv.index_fill_(0, idx, 0)


class TpuWorker(Worker):
    """vLLM's v1 GPU worker on a "tpu" device (one device per process)."""

    def __init__(self, vllm_config: VllmConfig, local_rank: int, rank: int,
                 distributed_init_method: str, is_driver_worker: bool = False):
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        from . import register_extensions

        # vLLM runs it as a general plugin already; again here (idempotent) for environments
        # that filter plugins (VLLM_PLUGINS): the model is built after this
        register_extensions()
        if self.use_v2_model_runner:
            raise ValueError("torchtpu's vLLM worker runs vLLM's V1 model runner; "
                             "unset VLLM_USE_V2_MODEL_RUNNER")
        if self.model_config.enable_sleep_mode:
            raise NotImplementedError("torchtpu's vLLM worker: sleep mode (enable_sleep_mode) is not supported")

    def init_device(self):
        # gpu_worker.Worker.init_device accepts only device_type "cuda".
        if self.device_config.device_type != "tpu":
            raise RuntimeError(f"TpuWorker: unsupported device type {self.device_config.device}")
        if not torch.tpu.is_initialized():
            # the physical device: TORCHTPU_VISIBLE_DEVICES indexed by this worker's local rank
            torch.tpu.set_device(self.local_rank)
        torch.tpu.init()
        self.device = torch.device("tpu", 0)  # this process's one device
        current_platform.check_if_supports_dtype(self.model_config.dtype)

        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)

        gc.collect()
        torch.accelerator.empty_cache()
        # Free/total memory from torch.tpu.mem_get_info (torch.accelerator.get_memory_info on
        # "tpu"), which honours TORCHTPU_MEMORY_LIMIT; gpu_memory_utilization scales the total.
        self.init_snapshot = init_snapshot = MemorySnapshot(device=self.device)
        self.requested_memory = request_memory(init_snapshot, self.cache_config)
        logger.debug("tpu worker init memory snapshot: %r", init_snapshot)
        logger.debug("tpu worker requested memory: %sGiB", format_gib(self.requested_memory))
        self._init_workspace_and_model_runner()

    def _maybe_get_memory_pool_context(self, tag: str) -> AbstractContextManager:
        # gpu_worker.Worker asks vLLM's CuMem/XPU sleep-mode allocator for every platform but
        # CUDA-alike, XPU and CPU; tpu has no such allocator (sleep mode is refused in init).
        return nullcontext()

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Eager warm-up: the sampler at ``max_num_seqs`` rows, then the seed reset.

        gpu_worker.Worker's version also runs kernel_warmup(), which imports every model
        family's Triton warm-up module (minimax_m3 -> torchvision, not installable next to
        torch+cpu) and captures CUDA graphs; neither applies to an eager tpu step.
        """
        runner = self.model_runner
        runner.maybe_remove_all_loras(runner.lora_config)
        if self.compilation_config.cudagraph_mode != CUDAGraphMode.NONE:
            # Compiled steps: one forward per shape bucket (vLLM's capture sizes, the sizes
            # its dispatcher pads every step to), largest first, so that each compiled piece
            # has its program for every bucket before the first request (compiler.py).
            for runtime_mode, descs in runner.cudagraph_dispatcher.get_capture_descs():
                for desc in sorted(descs, key=lambda d: -d.num_tokens):
                    runner._dummy_run(desc.num_tokens, cudagraph_runtime_mode=runtime_mode,
                                      uniform_decode=desc.uniform, skip_eplb=True, remove_lora=False)
            torch.tpu.synchronize()
        if get_pp_group().is_last_rank:
            max_num_reqs = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
            hidden_states, last_hidden_states = runner._dummy_run(
                num_tokens=max_num_reqs, skip_eplb=True, cudagraph_runtime_mode=CUDAGraphMode.NONE)
            if runner.is_pooling_model:
                runner._dummy_pooler_run(hidden_states)
            else:
                runner._dummy_sampler_run(hidden_states=last_hidden_states)
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(language_model=self.compilation_config.compilation_time,
                                encoder=self.compilation_config.encoder_compilation_time)

    def _make_model_runner(self) -> GPUModelRunner:
        return TpuModelRunner(self.vllm_config, self.device)
