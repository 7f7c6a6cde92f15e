"""Device spec for transformers' test suite (``TRANSFORMERS_TEST_DEVICE_SPEC``).

transformers.testing_utils imports the file named by TRANSFORMERS_TEST_DEVICE_SPEC
as a module and reads the names below to dispatch its device-agnostic helpers
(``backend_manual_seed``, ``backend_empty_cache``, ``backend_device_count``) and
its device choice (``torch_device = DEVICE_NAME``). It imports the file by a name
relative to the directory pytest runs from, so point it at a file there that
re-exports this module (``from torchtpu.testing import *``); tools/hf_suite.sh
writes one.

Importing this module imports torchtpu, which registers the "tpu" device (needed
when ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).
"""
from __future__ import annotations

import torch

import torchtpu  # noqa: F401  registers the "tpu" device and torch.tpu

__all__ = [
    "DEVICE_NAME",
    "MANUAL_SEED_FN",
    "EMPTY_CACHE_FN",
    "DEVICE_COUNT_FN",
    "SINGLE_PROCESS_DEVICE",
    "SYNCHRONIZE_FN",
    "MEMORY_ALLOCATED_FN",
    "MAX_MEMORY_ALLOCATED_FN",
    "RESET_MAX_MEMORY_ALLOCATED_FN",
    "RESET_PEAK_MEMORY_STATS_FN",
]

# torch_device for every test: tensors go to torch.device("tpu").
DEVICE_NAME = "tpu"

# The tpu generator only: transformers seeds the CPU generator itself (set_seed).
MANUAL_SEED_FN = torch.tpu.manual_seed
EMPTY_CACHE_FN = torch.tpu.empty_cache
# What torch.accelerator reports (one process drives one device).
DEVICE_COUNT_FN = torch.tpu.device_count
# Tests that transformers runs in a subprocess (run_test_using_subprocess) run in
# the current process on this device, as they do for torch_xla.
SINGLE_PROCESS_DEVICE = True

# Not read by transformers 5.23's spec loader (it fills these tables from
# torch.tpu / torch.accelerator itself); provided for spec loaders that do.
SYNCHRONIZE_FN = torch.tpu.synchronize
MEMORY_ALLOCATED_FN = torch.tpu.memory_allocated
MAX_MEMORY_ALLOCATED_FN = torch.tpu.max_memory_allocated
RESET_MAX_MEMORY_ALLOCATED_FN = torch.tpu.reset_max_memory_allocated
RESET_PEAK_MEMORY_STATS_FN = torch.tpu.reset_peak_memory_stats
