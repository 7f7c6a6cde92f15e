"""Fake-tensor (shape) rules for ATen ops whose PyTorch meta kernel encodes a
CUDA-only limit that torchtpu's lowering does not have.

torch's meta kernel for ``aten::_grouped_mm`` (torch/_meta_registrations.py,
``_meta_grouped_mm_common``: "Implementing all the checks from
_grouped_mm_cuda()") refuses float32 (torch 2.13: anything but bfloat16;
2.14: anything but bfloat16/float16), so ``torch.compile`` of a MoE model in
float32 fails while Dynamo traces it, although eager tpu runs it (the C++
rule in csrc/core/aten/meta.cpp) and transformers 5.23 sends tpu tensors to
``_grouped_mm`` for every dtype (``integrations/moe.py``,
``_can_use_grouped_mm``). The rule here is registered with
``torch.library.register_fake`` (FakeTensorMode consults it before the meta
kernel): on tpu fake tensors it gives the output of the C++ rule; on every
other device it calls torch's own meta function, so CPU and CUDA tensors get
exactly what they got before, errors included.
"""
from __future__ import annotations

import torch

_registered = False


def _torch_grouped_mm_meta():
    import torch._meta_registrations as m

    return m.meta_grouped_mm


def _grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    if mat_a.device.type != "tpu" and mat_b.device.type != "tpu":
        return _torch_grouped_mm_meta()(mat_a, mat_b, offs, bias, out_dtype)
    op = "torch._grouped_mm: "
    torch._check(mat_a.dim() in (2, 3), lambda: f"{op}mat_a must be 2D or 3D, got {mat_a.dim()}D")
    torch._check(mat_b.dim() in (2, 3), lambda: f"{op}mat_b must be 2D or 3D, got {mat_b.dim()}D")
    torch._check(mat_a.dtype == mat_b.dtype and mat_a.dtype.is_floating_point,
                 lambda: f"{op}mat_a and mat_b must have the same floating dtype, got {mat_a.dtype} and {mat_b.dtype}")
    torch._check(bias is None, lambda: f"{op}bias is not supported (as on CUDA)")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    torch._check((offs is not None) == (a2 or b2),
                 lambda: f"{op}offs is required when mat_a or mat_b is 2D" if a2 or b2
                 else f"{op}offs must be None for 3D x 3D")
    if not (a2 and b2):
        torch._check(mat_a.size(-1) == mat_b.size(-2),
                     lambda: f"{op}contraction dimension of mat_a and mat_b must match")
    if offs is not None:
        torch._check(offs.dim() == 1 and offs.dtype in (torch.int32, torch.int64),
                     lambda: f"{op}offs must be a 1-D int32 tensor, got {tuple(offs.shape)} {offs.dtype}")
        g = offs.size(0)
        if a2 and b2:
            torch._check(mat_a.size(1) == mat_b.size(0), lambda: f"{op}mat_a and mat_b must share K")
            sizes = (g, mat_a.size(0), mat_b.size(1))
        elif a2:
            torch._check(mat_b.size(0) == g, lambda: f"{op}offs has {g} groups but mat_b has {mat_b.size(0)}")
            sizes = (mat_a.size(0), mat_b.size(2))
        else:
            torch._check(mat_a.size(0) == g, lambda: f"{op}offs has {g} groups but mat_a has {mat_a.size(0)}")
            sizes = (mat_a.size(1), mat_b.size(1))
    else:
        torch._check(mat_a.size(0) == mat_b.size(0), lambda: f"{op}batch sizes must match")
        sizes = (mat_a.size(0), mat_a.size(1), mat_b.size(2))
    return mat_a.new_empty(sizes, dtype=out_dtype or mat_a.dtype)


def register() -> None:
    """Registers the rules (idempotent); called when Dynamo's backend registry loads."""
    global _registered
    if _registered:
        return
    _registered = True
    torch.library.register_fake("aten::_grouped_mm", _grouped_mm, allow_override=True)
