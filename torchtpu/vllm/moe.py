"""Unquantized fused MoE on tpu: plain torch ops, static shapes.

vLLM 0.33 selects ``UnquantizedMoeBackend.OOT`` for every out-of-tree platform
(``model_executor/layers/fused_moe/oracle/unquantized.py`` ``select_unquantized_moe_backend``)
and builds no expert kernel for it ("OOT handles internally"): the platform is expected to
register its own ``UnquantizedFusedMoEMethod`` through vLLM's public
``CustomOp.register_oot`` (the pattern vLLM's ``custom_op.py`` documents for
out-of-tree MoE methods). Without it, the first MoE forward fails with
``'UnquantizedFusedMoEMethod' object has no attribute 'is_monolithic'`` (its
``experts_cls`` is None).

The default router (``FusedTopKRouter``) calls ``vllm._C``'s ``topk_softmax``, which does not
exist without vLLM's CUDA build, so this method is *monolithic*: vLLM hands it the router
logits and it does the routing itself (softmax or sigmoid scores, top-k, renormalisation,
routed scaling), then every expert densely as batched matmuls over the expert axis,
combined with the routing weights. Shapes depend only on the token count (no gathers of a
data-dependent size), so each batch size lowers to one XLA program; the compute is
``num_experts / top_k`` times the sparse minimum, fine for small expert counts.
Expert biases and gpt-oss's clamped SwiGLU are supported. Grouped top-k, custom routing
functions, score-correction bias, expert parallelism and EPLB raise NotImplementedError
naming the feature.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

_registered = False


def _act_and_mul(activation: MoEActivation, h: torch.Tensor) -> torch.Tensor:
    if activation in (MoEActivation.SWIGLUOAI, MoEActivation.SWIGLUOAI_UNINTERLEAVE):
        # gpt-oss's clamped SwiGLU (vLLM's SwigluOAIAndMul: alpha 1.702, limit 7); SWIGLUOAI has
        # gate/up interleaved in w13, the _UNINTERLEAVE variant has them as two halves
        if activation == MoEActivation.SWIGLUOAI:
            g, u = h[..., ::2], h[..., 1::2]
        else:
            g, u = h[..., :h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
        g, u = g.clamp(max=7.0), u.clamp(min=-7.0, max=7.0)
        return (u + 1) * (g * torch.sigmoid(g * 1.702))
    if activation.is_gated:
        d = h.shape[-1] // 2
        g, u = h[..., :d], h[..., d:]
    else:
        g, u = h, None
    name = activation.value.removesuffix("_no_mul")
    if name == "silu":
        a = F.silu(g)
    elif name == "gelu":
        a = F.gelu(g)
    elif name == "gelu_tanh":
        a = F.gelu(g, approximate="tanh")
    elif name == "relu2":
        a = torch.square(F.relu(g))
    else:
        raise NotImplementedError(f"torchtpu's vLLM MoE: activation {activation.value!r} is not supported")
    return a if u is None else a * u


def check_supported(method, layer) -> None:
    """NotImplementedError naming every routing feature of ``layer`` that moe_forward lacks."""
    unsupported = []
    if getattr(layer, "use_grouped_topk", False):
        unsupported.append("grouped top-k routing")
    if getattr(layer, "custom_routing_function", None) is not None:
        unsupported.append("a custom routing function")
    if getattr(layer, "e_score_correction_bias", None) is not None:
        unsupported.append("score-correction bias")
    if getattr(layer, "expert_map", None) is not None:
        unsupported.append("expert parallelism (expert_map)")
    if getattr(layer, "apply_router_weight_on_input", False):
        unsupported.append("router weights on the input")
    if unsupported:
        raise NotImplementedError(f"torchtpu's vLLM MoE ({type(method).__name__}) does not support "
                                  + ", ".join(unsupported) + " yet")


def moe_forward(method, layer, x: torch.Tensor, router_logits: torch.Tensor,
                w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Routing from the router logits and every expert densely: x [T, H], w13 [E, 2I, H],
    w2 [E, H, I] (in x's dtype), the layer's expert biases when the method has them."""
    check_supported(method, layer)
    num_experts = w13.shape[0]
    scores = router_logits.float()
    if layer.scoring_func == "softmax":
        scores = torch.softmax(scores, dim=-1)
    elif layer.scoring_func == "sigmoid":
        scores = torch.sigmoid(scores)
    else:
        raise NotImplementedError(f"torchtpu's vLLM MoE: scoring function {layer.scoring_func!r}")
    weights, ids = torch.topk(scores, layer.top_k, dim=-1)
    if layer.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if layer.routed_scaling_factor != 1.0:
        weights = weights * layer.routed_scaling_factor
    # [T, E] combine weights: zero for experts a token was not routed to.
    combine = (F.one_hot(ids.long(), num_experts).to(weights.dtype) * weights.unsqueeze(-1)).sum(1)
    h = torch.einsum("th,eih->eti", x, w13)                          # [E, T, 2I]
    if method.moe.has_bias:
        h = h + layer.w13_bias.to(h.dtype).unsqueeze(1)
    a = _act_and_mul(layer.activation, h)                            # [E, T, I]
    y = torch.einsum("eti,ehi->eth", a, w2)                          # [E, T, H]
    if method.moe.has_bias:
        y = y + layer.w2_bias.to(y.dtype).unsqueeze(1)
    return torch.einsum("te,eth->th", combine.to(y.dtype), y)


class TpuMoEMixin:
    """What torchtpu's MoE methods share: monolithic (routing inside), no EPLB, experts by
    moe_forward on the weights ``expert_weights`` gives (in the activations' dtype)."""

    @property
    def is_monolithic(self) -> bool:
        return True

    @property
    def supports_eplb(self) -> bool:
        return False

    def expert_weights(self, layer, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.w13_weight, layer.w2_weight

    def apply_monolithic(self, layer, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        return moe_forward(self, layer, x, router_logits, *self.expert_weights(layer, x.dtype))

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        raise AssertionError("torchtpu's MoE methods are monolithic (they route inside apply_monolithic)")


class TpuUnquantizedFusedMoEMethod(TpuMoEMixin, UnquantizedFusedMoEMethod):
    """vLLM's unquantized MoE method with routing and experts as torch ops (see module doc)."""


def register() -> None:
    """Registers the tpu MoE method with vLLM's public out-of-tree CustomOp registry (once per
    process, before the model is built)."""
    global _registered
    if _registered:
        return
    UnquantizedFusedMoEMethod.register_oot(TpuUnquantizedFusedMoEMethod, name="UnquantizedFusedMoEMethod")
    _registered = True
