"""torchtitan's FluxTrainer on the tpu device.

One obstacle needs a subclass: ``FluxTrainer.__init__`` loads the autoencoder with
``load_ae(path, ..., device=self.device)`` -> ``safetensors.torch.load_file(path,
device="tpu:0")`` (``torchtitan/models/flux/model/autoencoder.py:463``), and safetensors' Rust
core accepts only the device names it knows (cpu, cuda, mps, npu, xpu, xla, hpu, mlu, musa):
"device tpu:0 is invalid", for every PrivateUse1 device (safetensors issue #674's kind; draft
PR #779 adds a device hook). Smallest upstream change, either: torchtitan's ``load_ae`` reads the
file on the CPU and copies into the module (``load_sft(ckpt_path, device="cpu")``, then
``load_state_dict`` without ``assign``), or safetensors hands device strings it does not know
to torch (docs/titan.md).

This subclass builds the three encoders the way torchtitan's ``random_init`` test path does
(the same modules, on the device) and then loads the checkpoints itself: the autoencoder from
its safetensors file read on the CPU, the T5 and CLIP encoders with transformers'
``from_pretrained`` on the CPU, copied into the (FSDP-sharded) device modules with
``torch.distributed.checkpoint.state_dict.set_model_state_dict``. Every key must match
(strict), where torchtitan's loader only prints missing and unexpected keys.

The subclass also checkpoints the random number generators, so that a resumed run is exact:
FLUX draws each step's noise and timesteps from the device generator and its caption dropout
and crops from the CPU generator, and torchtitan's checkpoint holds neither (its train state is
the step and the token count), so on any device a resumed FLUX run draws other noise than the
run it continues. Each rank's CPU and device generator states go into the train state under
its own key (ranks are seeded apart). The CPU generator is set back when the first batch is
drawn, after the data loader's iterator has taken its base seed from it (as the uninterrupted
run's did before its first step).

Everything else is torchtitan's FluxTrainer.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from torchtitan.models.flux.trainer import FluxTrainer as _TitanFluxTrainer

__all__ = ["FluxTrainer", "from_titan_config"]


class FluxTrainer(_TitanFluxTrainer):
    @dataclass(kw_only=True, slots=True)
    class Config(_TitanFluxTrainer.Config):
        pass

    def __init__(self, config: Config):
        load = not config.encoder.random_init
        config.encoder.random_init = True  # build the modules; their weights are loaded below
        try:
            super().__init__(config)
        finally:
            config.encoder.random_init = not load
        if load:
            self._load_encoders(config)

    def _load_encoders(self, config: Config) -> None:
        import os

        import torch
        from safetensors.torch import load_file
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        path = config.encoder.autoencoder_path
        if not os.path.exists(path):
            raise ValueError(f"Autoencoder path {path} does not exist. Please download it first "
                             "(or write local assets: python -m torchtpu.titan.assets)")
        self.autoencoder.load_state_dict(load_file(path, device="cpu"), strict=True)

        model_args = config.model_spec.model
        for embedder, version in ((self.clip_encoder, config.encoder.clip_encoder or model_args.clip_encoder.version),
                                  (self.t5_encoder, config.encoder.t5_encoder or model_args.t5_encoder.version)):
            hf_cls = type(embedder.hf_module)
            kwargs = (model_args.clip_encoder if embedder.is_clip else model_args.t5_encoder).hf_kwargs
            with torch.device("cpu"):
                pretrained = hf_cls.from_pretrained(version, **kwargs)
            sd = {f"hf_module.{k}": v for k, v in pretrained.state_dict().items()}
            set_model_state_dict(embedder, sd, options=StateDictOptions(full_state_dict=True, strict=True))
            del pretrained, sd


    # --- the generators in the train state ---------------------------------------------------

    def _rng_key(self) -> str:
        import torch.distributed as dist

        return f"rng_rank{dist.get_rank() if dist.is_initialized() else 0}"

    def state_dict(self):
        import torch

        sd = super().state_dict()
        sd[self._rng_key()] = {"cpu": torch.get_rng_state(),
                               "device": torch.get_device_module(self.device).get_rng_state(self.device)}
        return sd

    def load_state_dict(self, state_dict):
        import torch

        super().load_state_dict(state_dict)
        rng = state_dict.get(self._rng_key())
        if rng is not None:  # a checkpoint written by torchtitan's own FluxTrainer has none
            self._resumed_cpu_rng = rng["cpu"]
            torch.get_device_module(self.device).set_rng_state(rng["device"], self.device)

    def batch_generator(self, data_iterable):
        import torch

        it = iter(data_iterable)  # torch's DataLoader draws its base seed from the CPU generator
        cpu = getattr(self, "_resumed_cpu_rng", None)
        if cpu is not None:
            torch.set_rng_state(cpu)
            self._resumed_cpu_rng = None
        yield from super().batch_generator(it)


def from_titan_config(config: _TitanFluxTrainer.Config) -> FluxTrainer.Config:
    """torchtitan's FluxTrainer.Config as this subclass's Config (the same field values)."""
    return FluxTrainer.Config(**{f.name: getattr(config, f.name) for f in fields(config) if f.init})
