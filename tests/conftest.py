import os
import sys

import pytest

# Tests import the checkout's torchtpu (the build links torchtpu/_C*.so into it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tempfile  # noqa: E402

# Tests use a private persistent cache unless the caller chose one.
os.environ.setdefault("TORCHTPU_CACHE_DIR", tempfile.mkdtemp(prefix="torchtpu-test-cache-"))

import torch  # noqa: E402

import torchtpu  # noqa: E402,F401


@pytest.fixture
def metrics():
    """Resets torchtpu's counters; the test reads torchtpu.metrics() afterwards."""
    torchtpu.reset_metrics()
    yield torchtpu.metrics
