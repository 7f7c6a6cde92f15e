"""FLUX through torchtitan's own FluxTrainer on "tpu" (issue 38), with the local assets of
``python -m torchtpu.titan.assets`` (tiny T5 and CLIP encoders at FLUX.1's widths with their
tokenizers, random autoencoders in FLUX's layout, a webdataset shard of image-caption pairs):

* ``flux_testmodel`` (CPU-sized FLUX: torchtitan's flux-debug architecture at hidden 256) on 2
  processes, FSDP 2, ``--compile.enable``: trains, every block graph and the loss compiled, the
  validator's sampling runs and writes its images;
* DCP save at step 2 and a resumed run give step 3 exactly (torchtpu.titan.flux checkpoints the
  generators FLUX draws its noise and timesteps from);
* the ``flux_dev`` recipe: its model is FLUX.1-dev's transformer (parameter count equal to
  diffusers' ``FluxTransformer2DModel`` with FLUX.1-dev's config, less the guidance embedding
  torchtitan does not train), and its dry run (bf16, full AC, compiled) trains on 2 processes.
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan")

import torch  # noqa: E402

from test_titan import ANSI, ROOT, _env, train  # noqa: E402
from test_titan_recipes import assert_pod_recipe  # noqa: E402
from torchtpu.titan import config_registry as reg  # noqa: E402

VALIDATE = re.compile(r"validate step:\s*(\d+)\s+loss:\s*([-\d.e+]+)")


@pytest.fixture(scope="module")
def flux_assets(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("flux"))
    r = subprocess.run([sys.executable, "-m", "torchtpu.titan.assets", os.path.join(tmp, "tests", "assets"),
                        "--docs", "20", "--flux-test-only"], cwd=ROOT, env=_env(tmp), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_flux_dev_transformer_is_flux1_dev():
    diffusers = pytest.importorskip("diffusers")
    c = reg.flux_dev()
    with torch.device("meta"):
        titan = _count(c.model_spec.model.build())
        ref = {g: _count(diffusers.FluxTransformer2DModel(
            patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=g,
            axes_dims_rope=(16, 56, 56))) for g in (False, True)}
    assert titan == ref[False], (titan, ref)
    # FLUX.1-dev's published 11.9B include the guidance embedding (an MLP 256 -> 3072 -> 3072) of
    # its guidance-distilled checkpoint; torchtitan trains FLUX without it
    assert ref[True] - titan == 256 * 3072 + 3072 + 3072 * 3072 + 3072
    assert abs(ref[True] - 11.9e9) / 11.9e9 < 1e-3


def test_flux_autoencoder_is_fluxs():
    """The autoencoder the assets write for flux-debug/flux-dev has FLUX.1's size (diffusers'
    AutoencoderKL with FLUX.1's config)."""
    diffusers = pytest.importorskip("diffusers")
    ae = reg.flux_dev().model_spec.model.autoencoder
    with torch.device("meta"):
        titan = _count(ae.build())
        ref = _count(diffusers.AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            latent_channels=16, use_quant_conv=False, use_post_quant_conv=False))
    assert titan == ref, (titan, ref)


def test_flux_dev_is_a_pod_recipe():
    c, d = reg.flux_dev(), reg.flux_dev_dryrun()
    for x in (c, d):
        assert type(x).__module__ == "torchtpu.titan.flux", type(x)
        assert_pod_recipe(x)
    assert c.model_spec.flavor == "flux-dev" and d.model_spec.flavor == "flux-test"
    assert c.encoder.t5_encoder == "" and c.model_spec.model.t5_encoder.version == "google/t5-v1_1-xxl"


def _validations(out: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in VALIDATE.finditer(ANSI.sub("", out))}


def test_flux_trains_fsdp2_compiled(flux_assets):
    """FSDP 2, --compile.enable: the loss is finite and some later step is below step 1 (seeded;
    each step draws other timesteps, so 3 losses need not fall monotonically), every graph is a
    torchtpu program, the validator samples an image on each rank at steps 1 and 3."""
    log = []
    run = train(flux_assets, "flux_compiled", 2, 3, "--compile.enable", config="flux_testmodel",
                env={"PYTHONWARNINGS": "always"}, log=log)
    assert all(loss == loss and 0 < loss < 10 for loss, _ in run.values()), run
    assert min(run[2][0], run[3][0]) < run[1][0], run
    assert "running this graph eagerly" not in log[0], log[0][-6000:]
    val = _validations(log[0])
    assert sorted(val) == [1, 3] and all(v == v for v in val.values()), val
    images = glob.glob(os.path.join(flux_assets, "flux_compiled", "outputs", "img", "*.png"))
    assert len(images) == 4, images  # 2 ranks x steps 1 and 3


def test_flux_checkpoint_resume_is_exact(flux_assets):
    """DCP save at step 2 (model, optimizer, scheduler, data loader, generators) on 2 processes;
    a new run resumes from it and gives step 3's loss and gradient norm exactly."""
    flags = ("--validator.no-enable", "--checkpoint.enable")
    first = train(flux_assets, "flux_ckpt", 2, 3, *flags, "--checkpoint.interval", "2",
                  "--dump_folder", os.path.join(flux_assets, "flux_ckpt_out"), config="flux_testmodel")
    ckpt = os.path.join(flux_assets, "flux_ckpt_out", "checkpoint")
    resumed_dir = os.path.join(flux_assets, "flux_resumed_out", "checkpoint")
    os.makedirs(resumed_dir)
    os.rename(os.path.join(ckpt, "step-2"), os.path.join(resumed_dir, "step-2"))
    resumed = train(flux_assets, "flux_resumed", 2, 3, *flags, "--checkpoint.interval", "1000",
                    "--dump_folder", os.path.join(flux_assets, "flux_resumed_out"), config="flux_testmodel")
    assert sorted(resumed) == [3], resumed
    assert resumed[3] == first[3], (first, resumed)


def test_flux_dev_dry_run(flux_assets):
    """flux_dev's recipe (bf16 parameters, f32 reduction, full activation checkpointing, blocks and
    loss compiled, FSDP) at the test size on 2 processes: trains, every graph compiled."""
    log = []
    run = train(flux_assets, "flux_dry", 2, 2, config="flux_dev_dryrun", env={"PYTHONWARNINGS": "always"}, log=log)
    assert all(loss == loss and 0 < loss < 10 for loss, _ in run.values()), run
    assert "running this graph eagerly" not in log[0], log[0][-6000:]
