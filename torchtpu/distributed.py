"""torch.distributed on "tpu": the ``"tpu"`` c10d backend.

Importing torchtpu registers it (``torch.distributed`` is already loaded by
``import torch``, so this costs one dictionary update), so all of these work::

    dist.init_process_group("tpu")                 # tpu and cpu tensors
    dist.init_process_group()                      # tpu is the accelerator
    dist.init_process_group("cpu:gloo,tpu:tpu")
    init_device_mesh("tpu", (2,))

Transport: every collective stages through torch's ProcessGroupGloo on host
copies (``csrc/core/dist/distributed.cpp``): tpu tensor → host copy → Gloo → copied
back into the tpu tensor in place. This is correct on every PJRT plugin; it is
the only path on the XLA CPU plugin, which has no multi-process collectives
(see docs/design.md, "torch.distributed").

Before each collective the ranks exchange a small descriptor (op, dtype,
element counts, root, reduce op, split sizes), so mismatched calls raise a
RuntimeError on every rank instead of aborting inside Gloo.
``TORCHTPU_DIST_CHECK=0`` skips that exchange (one small message per
collective).
"""
from __future__ import annotations

from . import _env

BACKEND = "tpu"


def _check_enabled() -> bool:
    return _env.DIST_CHECK.get().strip().lower() not in ("0", "false", "no", "off")


def _create_backend(opts, backend_options=None):
    """c10d creator (extended API): a Gloo group on the same store, wrapped."""
    from torch.distributed import ProcessGroupGloo

    from . import _C

    _C._bind_distributed(_C)
    host = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    return _C._StagedBackend(host, opts.group_rank, opts.group_size, _check_enabled())


def register() -> None:
    """Registers the "tpu" c10d backend (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available() or not getattr(dist, "is_gloo_available", lambda: False)():
        return
    if getattr(dist.Backend, BACKEND.upper(), None) == BACKEND:
        return
    # Capable of cpu tensors too (Gloo runs them directly), so a "tpu" group
    # also serves object collectives and torch.distributed.checkpoint's
    # host-side exchanges.
    dist.Backend.register_backend(BACKEND, _create_backend, extended_api=True, devices=["cpu", "tpu"])
