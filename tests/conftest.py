import os
import sys

import pytest

# Tests import the checkout's torchtpu (the build links torchtpu/_C*.so into it).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import torchtpu  # noqa: E402,F401


@pytest.fixture
def metrics():
    """Resets torchtpu's counters; the test reads torchtpu.metrics() afterwards."""
    torchtpu.reset_metrics()
    yield torchtpu.metrics
