"""FLUX model configurations for the tpu registry, built from torchtitan's own pieces.

``test_model()`` is a CPU-sized FLUX (``flux-test``): torchtitan's ``flux-debug`` architecture
(double-stream then single-stream blocks, 3-axis RoPE, modulation, the same initialisation) at
hidden 256, 4 heads of 64, 2 + 2 blocks, reading the same text encoder widths as FLUX.1 (T5 4096,
CLIP 768), with a small autoencoder (``test_autoencoder()``: ch 32, one residual block per level;
the latent is still 16 channels at 1/8 of the image side, which torchtitan's FLUX code assumes).
"""
from __future__ import annotations

from copy import deepcopy
from dataclasses import replace

from torchtitan.models.flux import flux_configs as _titan_flux
from torchtitan.models.flux.model.autoencoder import AutoEncoder
from torchtitan.models.flux.model.layers import EmbedND, LastLayer, MLPEmbedder
from torchtitan.models.flux.model.model import FluxModel

__all__ = ["test_autoencoder", "test_model", "model_spec"]


def test_autoencoder() -> AutoEncoder.Config:
    return AutoEncoder.Config(resolution=64, in_channels=3, ch=32, out_ch=3, ch_mult=(1, 2, 4, 4),
                              num_res_blocks=1, z_channels=16, scale_factor=0.3611, shift_factor=0.1159)


def _resize_linear(lin, in_features: int | None = None, out_features: int | None = None):
    return replace(lin, in_features=in_features if in_features is not None else lin.in_features,
                   out_features=out_features if out_features is not None else lin.out_features)


def test_model(hidden: int = 256, heads: int = 4, depth: int = 2, single: int = 2,
               axes_dim: tuple = (16, 24, 24)) -> FluxModel.Config:
    """flux-debug's config with its widths and depths replaced (every linear resized the way
    torchtitan's own ``_make_double_block_config`` / ``_make_single_block_config`` size them)."""
    from torchtitan.models.flux import _make_double_block_config, _make_single_block_config

    base = _titan_flux["flux-debug"]()
    if sum(axes_dim) != hidden // heads:
        raise ValueError(f"flux test model: sum(axes_dim)={sum(axes_dim)} must equal the head dim "
                         f"{hidden // heads}")
    double = _make_double_block_config(hidden_size=hidden, num_heads=heads, mlp_ratio=base.mlp_ratio,
                                       qkv_bias=base.qkv_bias)
    single_cfg = _make_single_block_config(hidden_size=hidden, num_heads=heads, mlp_ratio=base.mlp_ratio)
    fl = base.final_layer_config
    return replace(
        base, hidden_size=hidden, num_heads=heads, depth=depth, depth_single_blocks=single,
        axes_dim=axes_dim,
        img_in=_resize_linear(base.img_in, out_features=hidden),
        txt_in=_resize_linear(base.txt_in, out_features=hidden),
        autoencoder=test_autoencoder(),
        pe_config=EmbedND.Config(dim=hidden // heads, theta=base.theta, axes_dim=axes_dim),
        time_in_config=MLPEmbedder.Config(
            in_dim=base.time_in_config.in_dim, hidden_dim=hidden,
            in_layer=_resize_linear(base.time_in_config.in_layer, out_features=hidden),
            out_layer=_resize_linear(base.time_in_config.out_layer, hidden, hidden)),
        vector_in_config=MLPEmbedder.Config(
            in_dim=base.vector_in_config.in_dim, hidden_dim=hidden,
            in_layer=_resize_linear(base.vector_in_config.in_layer, out_features=hidden),
            out_layer=_resize_linear(base.vector_in_config.out_layer, hidden, hidden)),
        double_blocks=[deepcopy(double) for _ in range(depth)],
        single_blocks=[deepcopy(single_cfg) for _ in range(single)],
        final_layer_config=LastLayer.Config(
            hidden_size=hidden, patch_size=fl.patch_size, out_channels=fl.out_channels,
            linear=_resize_linear(fl.linear, in_features=hidden),
            adaln_linear=_resize_linear(fl.adaln_linear, hidden, 2 * hidden)),
    )


def model_spec(model: FluxModel.Config, flavor: str):
    """A ModelSpec like torchtitan's ``flux.model_registry`` returns, for a config of ours."""
    from torchtitan.models.flux import FluxStateDictAdapter, parallelize_flux
    from torchtitan.protocols.model_spec import ModelSpec

    return ModelSpec(name="flux", flavor=flavor, model=model, parallelize_fn=parallelize_flux,
                     pipelining_fn=None, post_optimizer_build_fn=None,
                     state_dict_adapter=FluxStateDictAdapter)
