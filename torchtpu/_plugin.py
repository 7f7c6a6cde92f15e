"""Locating the PJRT plugin chosen by TORCHTPU_PLUGIN."""
from __future__ import annotations

import glob
import importlib.util
import os

_HINTS = {
    "cpu": "pip install xla-cpu-pjrt",
    "tpu": "pip install libtpu (on a Cloud TPU VM)",
    "cuda": "pip install xla-cuda13-pjrt (or jax-cuda13-pjrt)",
}


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.dirname(spec.origin) if spec.origin else None


def _preload_cuda_libs() -> None:
    """The CUDA plugin needs the nvidia-* wheels' libraries resolvable."""
    import ctypes

    nv = _package_dir("nvidia")
    if not nv:
        return
    order = ["cuda_runtime", "cuda_nvrtc", "nvjitlink", "cublas", "cufft", "cusolver",
             "cusparse", "cudnn", "nccl", "cu13", "cuda_cupti"]
    seen = set()
    for sub in order + sorted(os.listdir(nv)):
        for lib in sorted(glob.glob(os.path.join(nv, sub, "lib", "*.so*"))):
            if lib in seen:
                continue
            seen.add(lib)
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
    # ptxas from the nvidia-cuda-nvcc wheel, if present
    for cand in glob.glob(os.path.join(nv, "*", "bin")):
        if os.path.exists(os.path.join(cand, "ptxas")):
            os.environ["PATH"] = cand + os.pathsep + os.environ.get("PATH", "")


def resolve(choice: str | None = None) -> tuple[str, str]:
    """Returns (kind, path) of the plugin; raises ImportError with an install hint."""
    choice = (choice or os.environ.get("TORCHTPU_PLUGIN") or "cpu").strip()
    if choice.endswith(".so") or os.sep in choice:
        if not os.path.exists(choice):
            raise ImportError(f"torchtpu: TORCHTPU_PLUGIN={choice!r}: no such file")
        return "custom", choice
    if choice == "cpu":
        d = _package_dir("xla_plugins.xla_cpu_pjrt")
        path = os.path.join(d, "xla_cpu_pjrt.so") if d else ""
        if not d or not os.path.exists(path):
            raise ImportError("torchtpu: the XLA CPU PJRT plugin is missing: " + _HINTS["cpu"])
        return "cpu", path
    if choice == "tpu":
        path = os.environ.get("TPU_LIBRARY_PATH")
        if not path:
            d = _package_dir("libtpu")
            path = os.path.join(d, "libtpu.so") if d else ""
        if not path or not os.path.exists(path):
            raise ImportError("torchtpu: TORCHTPU_PLUGIN=tpu but libtpu is not installed: " + _HINTS["tpu"])
        return "tpu", path
    if choice in ("cuda", "gpu"):
        cands = []
        for pkg, rel in (("xla_plugins.xla_cuda13_pjrt", "xla_gpu_pjrt.so"),
                         ("xla_plugins.xla_cuda12_pjrt", "xla_gpu_pjrt.so"),
                         ("jax_plugins.xla_cuda13", "xla_cuda_plugin.so"),
                         ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so")):
            d = _package_dir(pkg)
            if d:
                cands += glob.glob(os.path.join(d, "*.so"))
                if os.path.exists(os.path.join(d, rel)):
                    cands.insert(0, os.path.join(d, rel))
        if not cands:
            raise ImportError("torchtpu: TORCHTPU_PLUGIN=cuda but no CUDA PJRT plugin is installed: "
                              + _HINTS["cuda"])
        _preload_cuda_libs()
        return "cuda", cands[0]
    raise ImportError(f"torchtpu: unknown TORCHTPU_PLUGIN={choice!r}: use cpu, tpu, cuda or a path to a PJRT plugin .so")
