"""transformers quantizers that keep FP8 / MXFP4 checkpoints packed on tpu
(see ``torchtpu.quant.packed_config``).

transformers picks the quantizer from the checkpoint's ``quant_method``;
its own ``fp8`` / ``mxfp4`` quantizers dequantize to bf16 on tpu (they
keep weights packed only on CUDA/XPU, and CPU with kernels for MXFP4) and
those names cannot be registered again (docs/design.md). These are registered under
their own names through ``register_quantization_config`` /
``register_quantizer`` and chosen by a model config whose
``quantization_config`` names them: ``packed_config(path)``. They build
torchtpu's packed modules on the meta device, the loader fills their buffers
with the checkpoint's bytes, and ``to_dict`` gives back the checkpoint's own
config (``save_pretrained`` writes a standard checkpoint).
"""
from __future__ import annotations

import re

import torch
from transformers import AutoConfig
from transformers.quantizers import (
    HfQuantizer,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.quantizers_utils import should_convert_module
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..quant import codecs as _codecs
from ..quant import modules as Q

FP8_METHOD = "torchtpu_fp8"
MXFP4_METHOD = "torchtpu_mxfp4"
_NAMES = {"fp8": FP8_METHOD, "mxfp4": MXFP4_METHOD}


class _PackedConfig(QuantizationConfigMixin):
    """The checkpoint's quantization_config (kept verbatim for to_dict) plus
    torchtpu's loading options."""

    source_method = ""
    options = {}

    def __init__(self, **kwargs):
        kwargs.pop("quant_method", None)
        opts = {k: kwargs.pop(k, v) for k, v in self.options.items()}
        self.checkpoint_config = dict(kwargs, quant_method=self.source_method)
        for k, v in {**kwargs, **opts}.items():
            setattr(self, k, v)
        self.modules_to_not_convert = kwargs.get("modules_to_not_convert")
        self.dequantize = False
        self.quant_method = _NAMES[self.source_method]

    def to_dict(self):
        return dict(self.checkpoint_config)

    def get_loading_attributes(self):
        return {k: getattr(self, k) for k in self.options}


@register_quantization_config(FP8_METHOD)
class TpuFp8Config(_PackedConfig):
    """Fine-grained FP8 (``quant_method: fp8``) kept as BlockFP8Linear;
    ``activations``: "bf16" (W8A16) or "fp8" (W8A8 blockwise _scaled_mm)."""

    source_method = "fp8"
    options = {"activations": "bf16"}


@register_quantization_config(MXFP4_METHOD)
class TpuMxfp4Config(_PackedConfig):
    """gpt-oss MXFP4 (``quant_method: mxfp4``) experts kept as PackedMXFP4Experts."""

    source_method = "mxfp4"


def _is_tpu(device):
    try:
        return isinstance(device, (str, torch.device)) and torch.device(device).type == "tpu"
    except RuntimeError:  # "disk", ...
        return False


def _check_device_map(device_map, what):
    devices = set(device_map.values()) if isinstance(device_map, dict) else {device_map}
    ok = all(_is_tpu(d) for d in devices)
    _codecs._check(ok, f"{what}: the packed weights run on tpu; pass device_map='tpu', got {device_map!r}")


class _PackedQuantizer(HfQuantizer):
    requires_calibration = True  # loads packed checkpoints; no quantization on the fly

    def validate_environment(self, *args, device_map=None, **kwargs):
        _check_device_map(device_map, type(self).__name__)

    def _skip(self, model):
        return self.get_modules_to_not_convert(model, self.quantization_config.modules_to_not_convert,
                                               model._keep_in_fp32_modules)

    def _check_packed(self, checkpoint_files, suffix, packed, experts=(), model=None):
        """The checkpoint's scaled tensors (names ending in `suffix`) are
        those of the modules packed from its quantization_config: one loaded
        into a plain module would lose its scales (transformers only warns).
        `experts`: packed experts modules, whose checkpoint tensors are per
        expert (`{name}.{e}.{proj}{suffix}`)."""
        files = [str(f) for f in checkpoint_files or ()]
        if not files or not all(f.endswith(".safetensors") for f in files):
            return
        from safetensors import safe_open

        scaled = set()
        for f in files:
            with safe_open(f, "pt") as h:
                scaled.update(k[:-len(suffix)] for k in h.keys() if k.endswith(suffix))
        if experts:  # per-expert tensors `{prefix}.{e}.{proj}`, the prefix as the model's converters rename it
            from transformers.conversion_mapping import get_model_conversion_mapping

            renamings = get_model_conversion_mapping(model)

            def renamed(name):
                name += "."
                for r in renamings:
                    name, _ = r.rename_source_key(name)
                return name.removesuffix(".")

            hit = {k: renamed(m.group(1)) for k in scaled if (m := re.match(r"(.*\.experts)\.\d+\.", k))}
            hit = {k: p for k, p in hit.items() if p in experts}
            scaled = (scaled - set(hit)) | set(hit.values())
            packed = [*packed, *experts]
        only_ckpt, only_packed = sorted(scaled - set(packed)), sorted(set(packed) - scaled)
        _codecs._check(not only_ckpt and not only_packed,
                 f"packed_config: the checkpoint's quantized tensors are not those of the modules its "
                 f"quantization_config quantizes: only in the checkpoint {only_ckpt[:3]}, only in the "
                 f"model {only_packed[:3]}")

    def is_serializable(self):
        return True

    @property
    def is_trainable(self):
        return False


@register_quantizer(FP8_METHOD)
class TpuFp8Quantizer(_PackedQuantizer):
    # experts' weight_scale_inv: merged into PackedFP8Experts' *_scale_inv (update_weight_conversions)
    serialized_names = {"weight": ["weight", "weight_scale_inv"]}

    @property
    def quantized_element_size(self):
        return 1

    def _process_model_before_weight_loading(self, model, **kwargs):
        qc = self.quantization_config
        skip = self._skip(model)
        block = getattr(qc, "weight_block_size", None)
        for name, mod in list(model.named_modules()):
            for cname, child in list(mod.named_children()):
                full = f"{name}.{cname}" if name else cname
                if (cname == "experts" and should_convert_module(full, skip)
                        and (stacked := _fp8_experts(full, child, block)) is not None):
                    setattr(mod, cname, stacked)
                elif type(child) is torch.nn.Linear and should_convert_module(full, skip):
                    N, K = child.weight.shape
                    bn, bk = getattr(qc, "weight_block_size", None) or (N, K)
                    w = torch.empty(N, K, dtype=torch.float8_e4m3fn, device="meta")
                    s = torch.empty(-(-N // bn), -(-K // bk), dtype=torch.float32, device="meta")
                    setattr(mod, cname, Q.BlockFP8Linear(w, s, (bn, bk), child.bias, qc.activations))
        packed = [n for n, m in model.named_modules() if isinstance(m, Q.BlockFP8Linear)]
        self._check_packed(kwargs.get("checkpoint_files"), ".weight_scale_inv", packed,
                           [n for n, m in model.named_modules() if isinstance(m, Q.PackedFP8Experts)], model)
        return model


def _fp8_experts(name, experts, block):
    """PackedFP8Experts (on meta) in place of a transformers experts module:
    its parameters have FP8Experts' names, so the model's converters merge the
    checkpoint's per-expert weights and (a copy of them, update_weight_conversions)
    their weight_scale_inv into them, and split them again on save. None for
    experts that are modules (a ModuleList of MLPs: their linears are packed)."""
    has_gate = getattr(experts, "has_gate", True)
    up = getattr(experts, "gate_up_proj" if has_gate else "up_proj", None)
    down = getattr(experts, "down_proj", None)
    if not isinstance(up, torch.Tensor) and not isinstance(down, torch.Tensor):
        return None
    ok = (isinstance(up, torch.Tensor) and isinstance(down, torch.Tensor) and up.dim() == down.dim() == 3
          and not getattr(experts, "is_transposed", False) and not getattr(experts, "has_bias", False)
          and getattr(experts, "is_concatenated", True) and not getattr(experts, "has_post_expert_norm", False))
    if not ok:
        raise NotImplementedError(
            f"packed_config: FP8 experts {name} ({type(experts).__name__}) are supported in transformers' "
            "stacked layout (gate_up_proj (E, 2I, H) or up_proj, down_proj (E, H, I); no biases, not transposed)")

    def meta(w, halves):
        E, N, K = w.shape
        bn, bk = block or (N // halves, K)
        gn = -(-(N // halves) // bn) * halves  # a fused gate_up: the gate's blocks, then the up's
        return (torch.empty(E, N, K, dtype=torch.float8_e4m3fn, device="meta"),
                torch.empty(E, gn, -(-K // bk), dtype=torch.float32, device="meta"))

    activation = experts._apply_gate if has_gate else experts.act_fn
    return Q.PackedFP8Experts(*meta(up, 2 if has_gate else 1), *meta(down, 1), block, activation, has_gate)


class _MXFP4Loading(torch.nn.Module):
    """Stands in for an experts module while the checkpoint loads: its
    tensors in the checkpoint's layout and names ((E, R, K/32, 16) bytes,
    (E, R, K/32) exponents, biases); the experts module comes back with
    PackedMXFP4Experts weights once loaded."""

    def __init__(self, experts, projs):
        super().__init__()
        self.__dict__["experts"] = experts  # not a submodule: not loaded, not initialized
        for proj in projs:
            E, K, R = getattr(experts, proj).shape  # transposed experts: x @ w[e], w[e] (K, R)
            self.register_buffer(f"{proj}_blocks", torch.empty(E, R, K // 32, 16, dtype=torch.uint8, device="meta"))
            self.register_buffer(f"{proj}_scales", torch.empty(E, R, K // 32, dtype=torch.uint8, device="meta"))
            setattr(self, f"{proj}_bias", getattr(experts, f"{proj}_bias"))

    def restore(self, projs):
        experts = self.experts
        for proj in projs:
            delattr(experts, proj)
            bias = getattr(self, f"{proj}_bias")
            setattr(experts, f"{proj}_bias", bias)
            setattr(experts, proj, Q.PackedMXFP4Experts(getattr(self, f"{proj}_blocks"),
                                                        getattr(self, f"{proj}_scales"), bias.dtype))
        return experts


@register_quantizer(MXFP4_METHOD)
class TpuMxfp4Quantizer(_PackedQuantizer):
    _PROJS = ("gate_up_proj", "down_proj")

    def _swap(self, model, make):
        skip = self._skip(model)
        for name, mod in list(model.named_modules()):
            for cname, child in list(mod.named_children()):
                full = f"{name}.{cname}" if name else cname
                if cname == "experts" and should_convert_module(full, skip):
                    new = make(child)
                    if new is not None:
                        setattr(mod, cname, new)

    def _loading(self, experts):
        if not all(getattr(experts, p, None) is not None for p in self._PROJS):
            return None
        _codecs._check(getattr(experts, "is_transposed", False)
                 and all(getattr(experts, f"{p}_bias", None) is not None for p in self._PROJS),
                 f"packed_config: MXFP4 experts are supported in gpt-oss' layout (transposed, with "
                 f"biases), not {type(experts).__name__}'s")
        return _MXFP4Loading(experts, self._PROJS)

    def _process_model_before_weight_loading(self, model, **kwargs):
        self._swap(model, self._loading)
        self._check_packed(kwargs.get("checkpoint_files"), "_blocks",
                           [f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, _MXFP4Loading)
                            for p in self._PROJS])
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        self._swap(model, lambda m: m.restore(self._PROJS) if isinstance(m, _MXFP4Loading) else None)
        model.set_experts_implementation("eager")  # per-expert weights, which the packed ones index
        return model

    def get_state_dict_and_metadata(self, model):
        sd = model.state_dict()
        for name, mod in model.named_modules():
            if isinstance(mod, Q.PackedMXFP4Experts):
                blocks, scales = sd.pop(f"{name}.blocks"), sd.pop(f"{name}.scales")
                E, R, H = blocks.shape
                sd[f"{name}_blocks"] = blocks.view(torch.uint8).reshape(E, R, H // 16, 16)
                sd[f"{name}_scales"] = scales.view(torch.uint8)
        return sd, {}


def packed_config(path, activations="bf16", methods=tuple(_NAMES), **kwargs):
    config = AutoConfig.from_pretrained(path, **kwargs)
    qc = getattr(config, "quantization_config", None) or {}
    qc = dict(qc if isinstance(qc, dict) else qc.to_dict())
    method = qc.get("quant_method")
    _codecs._check(method in methods, f"{path} is not a {' or '.join(methods)} checkpoint "
             f"(quantization_config: {qc or None})")
    qc["quant_method"] = _NAMES[method]
    if method == "fp8":
        qc["activations"] = activations
    config.quantization_config = qc
    return config
