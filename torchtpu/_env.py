"""The environment variables torchtpu reads, in one place."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

_VARS = {}


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str
    help: str

    def get(self) -> str:
        return os.environ.get(self.name, self.default)


def _var(name: str, default: str, help: str) -> EnvVar:
    v = EnvVar(name, default, help)
    _VARS[name] = v
    return v


PLUGIN = _var("TORCHTPU_PLUGIN", "cpu", "PJRT plugin: cpu | tpu | cuda | path to a plugin .so")
VISIBLE_DEVICES = _var("TORCHTPU_VISIBLE_DEVICES", "",
                       "index of the device this process drives; a list is indexed by LOCAL_RANK")
DIST_CHECK = _var("TORCHTPU_DIST_CHECK", "1", "torch.distributed: check sizes/dtypes across ranks per collective")
CPU_DEVICES = _var("TORCHTPU_CPU_DEVICE_COUNT", "1", "devices the CPU plugin creates")
MEMORY_LIMIT = _var("TORCHTPU_MEMORY_LIMIT", "", "device memory limit, bytes or 512M / 2G")
MODE = _var("TORCHTPU_MODE", "strict", "default eager mode: strict | debug | defer_and_fuse")
CACHE_DIR = _var("TORCHTPU_CACHE_DIR", "~/.cache/torchtpu",
                 "persistent compilation cache directory (default under the user cache dir); '' disables")
OP_PLANS = _var("TORCHTPU_OP_PLANS", "1",
                 "strict mode replays a repeated op's program and binding with no lowering (0: off)")
COMPILE_THREADS = _var("TORCHTPU_COMPILE_THREADS", "",
                        "threads compiling eager programs (default: CPU cores, at most 8; 0: the calling thread)")
XLA_THREADS = _var("TORCHTPU_XLA_THREADS", "",
                   "threads of the XLA CPU client's intra-op pool (default: every CPU the process may use)")
ASYNC_COMPILE = _var("TORCHTPU_ASYNC_COMPILE", "1",
                     "queue a launch whose program still compiles and dispatch on (0: wait for each compile)")
TPU_CHECK = _var("TORCHTPU_TPU_CHECK", "",
                 "also compile every new program for this Cloud TPU topology (e.g. v5e:1x1) with libtpu's "
                 "compile-only mode; failures in torchtpu.aot.check_report()")
TPU_CHECK_STRICT = _var("TORCHTPU_TPU_CHECK_STRICT", "0",
                        "with TORCHTPU_TPU_CHECK: compile for the TPU at once and raise at the op whose program fails")
CACHE_MAX_BYTES = _var("TORCHTPU_CACHE_MAX_BYTES", "8G", "size bound of the persistent cache (LRU eviction)")


def cache_dir() -> str:
    """The persistent cache directory, or '' when disabled."""
    v = os.environ.get("TORCHTPU_CACHE_DIR")
    if v is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "torchtpu")
    return os.path.expanduser(v)


def parse_bytes(s: str) -> int:
    s = s.strip()
    if not s:
        return 0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?", s)
    if not m:
        raise ValueError(f"torchtpu: cannot parse a byte size from {s!r} (examples: 1073741824, 512M, 2G)")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def describe() -> str:
    return "\n".join(f"{v.name} (default {v.default!r}): {v.help}" for v in _VARS.values())
