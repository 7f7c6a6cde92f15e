"""torchtpu.testing as transformers' test suite loads it (TRANSFORMERS_TEST_DEVICE_SPEC)."""
import os
import textwrap

import pytest

pytest.importorskip("transformers")

# transformers.testing_utils reads the spec once, at import: each case runs in a
# fresh interpreter whose working directory holds the re-exporting spec file.
# torchtpu is imported first, as the installed backend's autoload would (transformers caches
# is_torch_tpu_available() the first time it asks; tools/hf_suite.sh runs pytest -p torchtpu).
_CHECK = textwrap.dedent("""
    import torch
    import torchtpu.testing as spec
    from transformers import testing_utils as tu

    assert tu.torch_device == "tpu", tu.torch_device
    assert tu.BACKEND_MANUAL_SEED["tpu"] is spec.MANUAL_SEED_FN
    assert tu.BACKEND_EMPTY_CACHE["tpu"] is spec.EMPTY_CACHE_FN
    assert tu.BACKEND_DEVICE_COUNT["tpu"] is spec.DEVICE_COUNT_FN
    assert "tpu" in tu.SINGLE_PROCESS_DEVICES

    # manual_seed: the same seed gives the same tpu random numbers, another seed others.
    tu.backend_manual_seed("tpu", 1234)
    a = torch.randn(64, device="tpu").cpu()
    tu.backend_manual_seed("tpu", 1234)
    b = torch.randn(64, device="tpu").cpu()
    tu.backend_manual_seed("tpu", 4321)
    c = torch.randn(64, device="tpu").cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.tpu.initial_seed() == 4321

    assert tu.backend_device_count("tpu") == 1
    assert tu.backend_device_count("tpu") == torch.accelerator.device_count()

    # empty_cache frees the buffers of dead tensors (held by reference cycles too).
    import gc
    gc.disable()
    x = torch.ones(1 << 20, device="tpu")
    cyc = [x]
    cyc.append(cyc)
    del x, cyc
    before = torch.tpu.memory_allocated()
    tu.backend_empty_cache("tpu")
    assert torch.tpu.memory_allocated() <= before - 4 * (1 << 20), (before, torch.tpu.memory_allocated())
    gc.enable()

    # transformers fills synchronize and the accelerator module for "tpu" itself.
    tu.backend_synchronize("tpu")
    assert tu.backend_torch_accelerator_module("tpu") is torch.tpu
    print("ok")
""")


def _spec_dir(tmp_path):
    (tmp_path / "torchtpu_device_spec.py").write_text("from torchtpu.testing import *  # noqa: F401,F403\n")
    return str(tmp_path)


def test_spec_loaded_by_transformers(pyrun, tmp_path):
    cwd = _spec_dir(tmp_path)
    code = f"import os; os.chdir({cwd!r})\n" + _CHECK
    r = pyrun(code, env={"TRANSFORMERS_TEST_DEVICE_SPEC": "torchtpu_device_spec.py",
                         "TRANSFORMERS_TEST_DEVICE": None}, timeout=240)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_spec_device_must_match(pyrun, tmp_path):
    # transformers refuses a spec whose DEVICE_NAME disagrees with TRANSFORMERS_TEST_DEVICE:
    # the spec really is the file it loaded.
    cwd = _spec_dir(tmp_path)
    r = pyrun(f"import os; os.chdir({cwd!r})\nimport transformers.testing_utils",
              env={"TRANSFORMERS_TEST_DEVICE_SPEC": "torchtpu_device_spec.py",
                   "TRANSFORMERS_TEST_DEVICE": "cpu"}, timeout=240)
    assert r.returncode != 0 and "Mismatch" in r.stderr and "'tpu'" in r.stderr, r.stderr


def test_spec_names():
    import torch

    import torchtpu.testing as spec

    assert spec.DEVICE_NAME == "tpu" and torch.device(spec.DEVICE_NAME).type == "tpu"
    for name in spec.__all__:
        assert hasattr(spec, name), name
    assert spec.DEVICE_COUNT_FN() == 1
    assert os.path.basename(spec.__file__) == "testing.py"
