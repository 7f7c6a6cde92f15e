import os
import subprocess
import sys
import warnings

# Import torchtpu explicitly from this checkout: an installed torchtpu's
# torch.backends entry point (possibly another version) must not load first.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import pytest
import torch

import torchtpu  # noqa: F401  registers the "tpu" device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

warnings.filterwarnings("ignore", message="torchtpu: .* has no native tpu lowering")


def run_py(code: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter with torchtpu importable."""
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    e["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    if env:
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def pyrun():
    return run_py
