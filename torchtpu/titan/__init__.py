"""TorchTitan on "tpu": a config registry for torchtitan's own trainer.

    python -m torchtpu.titan.assets ./tests/assets        # local tokenizer + dataset (no hub)
    torchrun --nproc-per-node 2 -m torchtitan.train --module torchtpu.titan \\
        --config llama3_debugmodel --training.steps 10

torchtitan's ConfigManager imports ``torchtpu.titan.config_registry`` for
``--module torchtpu.titan`` (torchtitan/config/manager.py). This package's
``__init__`` imports nothing from torchtitan, so the asset builder runs
without it.
"""
