"""SGLang on "tpu" (torchtpu/sglang, docs/sglang.md): shared helpers of tests/sglang.

Needs SGLang 0.5.23 in the running environment (``bash tools/install_sglang.sh``, its own venv
on torch 2.14.1): skipped otherwise, so the main test run (no SGLang) skips this directory.
Every engine runs in a fresh subprocess (driver.py) in its own process group, killed at the
end, bounded in time. Tiny models and their tokenizer are built from configs (tests/vllm/tiny.py;
no hub).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))  # tiny.py: the serving tests' tiny models


def _has_sglang() -> bool:
    try:
        import importlib.metadata as md

        if not md.version("sglang").startswith("0.5."):
            return False
        return any(e.value == "torchtpu.sglang:platform" for e in md.entry_points(group="sglang.srt.platforms"))
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_sglang():
        return
    skip = pytest.mark.skip(reason="SGLang 0.5.x with torchtpu's sglang.srt.platforms entry point is not "
                                   "installed (bash tools/test_sglang.sh)")
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(skip)


def env(mode: str | None = "strict", extra: dict | None = None) -> dict:
    """The engine's environment; mode None: the platform's default (defer_and_fuse)."""
    e = dict(os.environ)
    # this checkout after whatever PYTHONPATH names first (a torchtpu built for this torch)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (e.get("PYTHONPATH"), ROOT) if p)
    e.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
             TORCHTPU_MEMORY_LIMIT="1G", SGLANG_PLATFORM="torchtpu", DO_NOT_TRACK="1")
    e.pop("TORCHTPU_MODE", None)
    if mode:
        e["TORCHTPU_MODE"] = mode
    e.update(extra or {})
    return e


def read_steps(path) -> list[dict]:
    """TORCHTPU_SGLANG_STEP_LOG's records (one per forward of a model process)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def run_engine(tmp_path, spec: dict, mode: str | None = "strict", timeout: int = 300, extra_env: dict | None = None):
    """Runs driver.py on ``spec``; returns (result, step records)."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    log = tmp_path / "engine.log"
    steps = tmp_path / "steps.jsonl"
    e = env(mode, {"TORCHTPU_SGLANG_STEP_LOG": str(steps), **(extra_env or {})})
    # output to a file, not a pipe: SGLang's scheduler and detokenizer processes inherit it
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "driver.py"), str(path)], env=e,
                                cwd=str(tmp_path), stdout=f, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    out = log.read_text()
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"SGLang run failed (rc={proc.returncode}):\n{out[-8000:]}"
    return json.loads(lines[-1][len("RESULT "):]), read_steps(steps)


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    import tiny

    d = str(tmp_path_factory.mktemp("sgl-llama"))
    model, tok = tiny.make_llama(d)
    return d, model, tok
