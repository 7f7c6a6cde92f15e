"""The persistent compilation cache: serialized PJRT executables (``*.ttx``) and, under
``torch/aotautograd``, AOTAutograd's cache entries for torch.compile(backend="tpu")."""
from __future__ import annotations

import os
import shutil

from . import _env


def directory() -> str:
    return _env.cache_dir()


def _entries():
    d = directory()
    if not d or not os.path.isdir(d):
        return []
    out = []
    for name in os.listdir(d):
        if name.endswith(".ttx"):
            p = os.path.join(d, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            out.append((p, st.st_size, st.st_mtime))
    return out


def torch_cache_dir() -> str:
    """Where torch.compile(backend="tpu") keeps torch's own caches (torch's
    TORCHINDUCTOR_CACHE_DIR during the backend call), or '' when caching is disabled."""
    d = directory()
    return os.path.join(os.path.abspath(d), "torch") if d else ""


def _aot_dir() -> str:
    d = torch_cache_dir()
    return os.path.join(d, "aotautograd") if d else ""


def info() -> dict:
    """Directory, number of executables, their total bytes, the size bound, and the number
    of AOTAutograd entries (traced torch.compile graphs; not counted in the bound)."""
    e = _entries()
    aot = _aot_dir()
    aot_n = sum(len(fs) for _, _, fs in os.walk(aot)) if aot else 0
    return {"directory": directory(), "enabled": bool(directory()), "entries": len(e),
            "bytes": sum(s for _, s, _ in e), "aot_entries": aot_n,
            "max_bytes": _env.parse_bytes(os.environ.get("TORCHTPU_CACHE_MAX_BYTES", "8G"))}


def clear() -> int:
    """Deletes every cached executable and AOTAutograd entry; returns how many executables
    were removed."""
    if _aot_dir():
        shutil.rmtree(_aot_dir(), ignore_errors=True)
    n = 0
    for p, _, _ in _entries():
        try:
            os.unlink(p)
            n += 1
        except OSError:
            pass
    return n
