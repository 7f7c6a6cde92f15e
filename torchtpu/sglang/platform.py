"""SGLang ``SRTPlatform`` for torchtpu's "tpu" device (out of tree, ``PlatformEnum.OOT``).

SGLang resolves it through the ``sglang.srt.platforms`` entry point (``torchtpu.sglang:platform``)
in every process it starts. Everything here is one of SGLang's public platform hooks
(sglang/srt/platforms/interface.py, device_mixin.py): class attributes, capability flags and
methods SGLang core calls on ``current_platform``.
"""
from __future__ import annotations

import os

import torch

import torchtpu  # noqa: F401  registers the "tpu" device, torch.tpu and the "tpu" c10d backend
from torchtpu import distributed as _tt_dist
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import PlatformCapabilities, SRTPlatform

ATTENTION_BACKEND = "torchtpu_paged"


def _local(device_id) -> int:
    """This process's device for SGLang's ``gpu_id``: SGLang runs one scheduler process per TP
    rank and passes the rank's gpu_id to device queries, some of them before it calls
    set_device; the first of them selects the device (torch.tpu.set_device before first use),
    after which it is this process's only device, index 0."""
    if device_id and not torch.tpu.is_initialized():
        torch.tpu.set_device(int(device_id))
    return 0


class TpuSRTPlatform(SRTPlatform):
    _enum = PlatformEnum.OOT
    device_name: str = "tpu"
    device_type: str = "tpu"
    # graph_capture: SGLang asks get_graph_runner_cls() for the decode runner (decode steps per
    # batch bucket, torchtpu/sglang/graph_runner.py; --disable-cuda-graph turns it off in SGLang
    # core); no Triton, no PyNccl (collectives go through the "tpu" c10d backend), no
    # piecewise CUDA-graph prefill, no HiCache device kernels.
    capabilities = PlatformCapabilities(supports_triton=False, graph_capture=True,
                                        piecewise_graph=False, hicache_device_kernels=False,
                                        supports_pynccl=False)

    def __init__(self) -> None:
        super().__init__()
        self._host_threads = torch.get_num_threads()

    def init_backend(self) -> None:
        # SGLang calls this once in each model process (model_runner.py:270). Unless the user
        # chose a mode (TORCHTPU_MODE), a step's eager work runs in torchtpu's defer_and_fuse
        # mode: the scheduler's input preparation, the model, the sampler fused into a few
        # programs per step (strict mode: one program per op, ~100 per decode step of a 2-layer
        # model).
        if not os.environ.get("TORCHTPU_MODE"):
            torchtpu.set_mode("defer_and_fuse")

    # ------------------------------------------------------------ device queries
    def get_device(self, device_id: int | None = 0) -> str:
        # a string: SGLang splits it on ":" (arg_groups/serving_hook.py); one device per process
        if device_id is not None:
            _local(device_id)
        return "tpu"

    def set_device(self, device) -> None:
        torch.tpu.set_device(device)

    def get_device_name(self, device_id: int = 0) -> str:
        return torch.tpu.get_device_name(_local(device_id))

    def get_device_uuid(self, device_id: int = 0) -> str:
        info = torch.tpu.get_device_properties(_local(device_id))
        return f"{info.platform_name}-{info.device_kind}-{device_id}"

    def get_device_capability(self, device_id: int = 0):
        return None

    def get_device_total_memory(self, device_id: int = 0) -> int:
        # the device's memory, or TORCHTPU_MEMORY_LIMIT where set (torch.tpu.mem_get_info)
        return int(torch.tpu.mem_get_info(_local(device_id))[1])

    def get_current_memory_usage(self, device=None) -> float:
        # SGLang sizes the KV pool as (total - this) * --mem-fraction-static
        return float(torch.tpu.memory_allocated(device))

    def get_available_memory(self, device_id: int = 0) -> tuple[int, int]:
        free, total = torch.tpu.mem_get_info(_local(device_id))
        return int(free), int(total)

    def is_pin_memory_available(self, device=None) -> bool:
        return False

    def empty_cache(self) -> None:
        torch.tpu.empty_cache()

    def synchronize(self) -> None:
        torch.tpu.synchronize()

    def get_torch_distributed_backend_str(self) -> str:
        return _tt_dist.BACKEND  # "tpu": torchtpu's c10d backend

    def get_group_coordinator_device(self, local_rank: int) -> torch.device:
        # one process per device: each rank's own "tpu" device (TORCHTPU_VISIBLE_DEVICES
        # indexed by the local rank where a host has several)
        return torch.device("tpu", _local(local_rank))

    def get_dispatch_key_name(self) -> str:
        return "native"  # SGLang's fused ops run forward_native: plain torch ops on tpu

    def get_compile_backend(self, mode: str | None = None) -> str:
        return "tpu"

    # ------------------------------------------------------------ subsystems
    def apply_server_args_defaults(self, server_args) -> None:
        if server_args.attention_backend is None:
            server_args.attention_backend = ATTENTION_BACKEND
        for name in ("prefill_attention_backend", "decode_attention_backend"):
            if getattr(server_args, name, None) is None and hasattr(server_args, name):
                setattr(server_args, name, ATTENTION_BACKEND)
        if getattr(server_args, "sampling_backend", None) is None:
            server_args.sampling_backend = "pytorch"
        # xgrammar's mask kernels accept cuda/cpu tensors only; outlines applies its mask with
        # masked_fill_, which runs on tpu
        if getattr(server_args, "grammar_backend", None) in (None, "xgrammar"):
            server_args.grammar_backend = "outlines"

    def get_default_attention_backend(self) -> str:
        return ATTENTION_BACKEND

    def get_kv_pool_cls(self, *, kind):
        # SGLang resolves every kind up front; MLA/DSA keep the in-tree pools, which the
        # attention backend refuses (TpuPagedAttnBackend.__init__) if a model ever uses them
        if kind != "mha":
            return None
        from .attention import TpuMHATokenToKVPool

        return TpuMHATokenToKVPool

    def get_graph_runner_cls(self):
        from .graph_runner import TpuGraphRunner

        return TpuGraphRunner

    def post_load_model(self, model: torch.nn.Module) -> None:
        # ModelRunner.load_model sets torch.set_num_threads(1) for every device but "cpu"
        # (model_runner.py:1278) "to reduce thread conflicts while loading weights". torchtpu's
        # host-side work (uploads, the sampler's host steps) runs on torch's CPU threads:
        # give them back once loading is done.
        torch.set_num_threads(self._host_threads)

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return False
