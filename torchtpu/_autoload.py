"""torch.backends entry point: `import torch` alone brings the tpu device.

When the import chain started at `import torchtpu`, torch's autoload runs
while torchtpu is still initializing; its own __init__ registers the device.
"""


def load() -> None:
    # Never let a problem here break `import torch` itself.
    try:
        import torchtpu

        if hasattr(torchtpu, "_register"):
            torchtpu._register()
    except Exception as e:  # pragma: no cover - reported, not raised
        import warnings

        warnings.warn(f"torchtpu could not be autoloaded: {e}")
