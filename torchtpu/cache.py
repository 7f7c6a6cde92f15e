"""The persistent compilation cache (serialized PJRT executables on disk)."""
from __future__ import annotations

import os

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


def info() -> dict:
    """Directory, number of entries, total bytes, and the size bound."""
    e = _entries()
    return {"directory": directory(), "enabled": bool(directory()), "entries": len(e),
            "bytes": sum(s for _, s, _ in e),
            "max_bytes": _env.parse_bytes(os.environ.get("TORCHTPU_CACHE_MAX_BYTES", "8G"))}


def clear() -> int:
    """Deletes every cached executable; returns how many were removed."""
    n = 0
    for p, _, _ in _entries():
        try:
            os.unlink(p)
            n += 1
        except OSError:
            pass
    return n
