import os
import subprocess
import sys
import tempfile
import warnings

# Import torchtpu explicitly from this checkout: an installed torchtpu's
# torch.backends entry point (possibly another version) must not load first.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# Tests use a private persistent cache unless the caller chose one.
os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-test-cache-"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tests import the checkout's torchtpu (the build links torchtpu/_C*.so into it).
sys.path.insert(0, ROOT)

import pytest  # noqa: E402
import torch  # noqa: E402

import torchtpu  # noqa: E402,F401  registers the "tpu" device

warnings.filterwarnings("ignore", message="torchtpu: .* has no native tpu lowering")


def run_py(code: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter with torchtpu importable."""
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
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


@pytest.fixture
def metrics():
    """Resets torchtpu's counters; the test reads torchtpu.metrics() afterwards."""
    torchtpu.reset_metrics()
    yield torchtpu.metrics
