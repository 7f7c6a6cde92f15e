"""The eager modes: strict (default), debug, defer_and_fuse (torchtpu.set_mode,
torchtpu.mode). Below every other Python module that switches modes."""
from __future__ import annotations

_MODES = {"strict": 0, "debug": 1, "defer_and_fuse": 2}
_MODE_NAMES = {v: k for k, v in _MODES.items()}


def set_mode(mode: str, *, check_nans: bool | None = None) -> None:
    """Sets the eager mode: "strict" (default), "debug" or "defer_and_fuse".

    Switching flushes pending (deferred) work. In debug mode every op runs
    synchronously (device errors are raised by the op's own call), index
    arguments are bounds-checked with CPU PyTorch's errors, outputs are
    validated against PyTorch's meta functions, and with ``check_nans=True``
    (or ``TORCHTPU_DEBUG_NANS=1``) the first op producing a NaN/Inf in a float
    output raises.
    """
    from . import _C

    if mode not in _MODES:
        raise ValueError(f"torchtpu.set_mode: unknown mode {mode!r}; choose one of {list(_MODES)}")
    if check_nans is not None:
        _C._set_debug_nans(bool(check_nans))
    _C._set_mode(_MODES[mode])


def get_mode() -> str:
    from . import _C

    return _MODE_NAMES[_C._get_mode()]


class mode:
    """Thread-local eager mode: ``with torchtpu.mode("debug"): ...``."""

    def __init__(self, name: str):
        if name not in _MODES:
            raise ValueError(f"torchtpu.mode: unknown mode {name!r}; choose one of {list(_MODES)}")
        self.name = name

    def __enter__(self):
        from . import _C

        # Scoped through c10's thread-local debug info, so autograd's device
        # threads run backward in this mode too. Entering/leaving flushes.
        _C._push_thread_mode(_MODES[self.name])
        return self

    def __exit__(self, *exc):
        from . import _C

        _C._pop_thread_mode()
        return False


class warmup:
    """``with torchtpu.warmup(): model.generate(...)`` — a warm-up request.

    Strict mode runs an op on the host the first ``TORCHTPU_HOST_TIER`` times
    its argument types and shapes are seen (default 2) and compiles its
    program after that, so a one-off shape (printing, a notebook cell) never
    pays an XLA compile. A serving loop repeats its requests, though, and the
    ops it sees once per request would compile on the second or third request:
    a latency spike after warm-up. Inside ``warmup()`` every op compiles on
    first sight and counts as seen often enough, so an identical request
    afterwards compiles nothing. Usable as a decorator too; nests; thread-safe
    (it counts process-wide)."""

    def __enter__(self):
        from . import _C

        _C._push_warmup()
        return self

    def __exit__(self, *exc):
        from . import _C

        _C._pop_warmup()
        return False

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapped(*a, **k):
            with warmup():
                return fn(*a, **k)

        return wrapped
