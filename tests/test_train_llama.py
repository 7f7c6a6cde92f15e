"""torchtpu.examples.train_llama: the TorchTitan-style Llama 3 recipe (FSDP2 over 2 processes).

Every launch has a deadline and runs in its own session, whose process group is
killed at the end (torchrun's workers included). The tiny model with --peak-tflops
skips the start-up matmul except in the test of the MFU figures.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch.distributed as dist

from test_distributed import ROOT, _env, _free_port

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with Gloo is not available")

COMMON = ["--steps", "6", "--lr", "3e-3", "--log-every", "3", "--peak-tflops", "0.1"]


def _run(cmd: list[str], timeout: int) -> str:
    p = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out = p.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out = p.communicate()[0]
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\n" + out[-4000:])
    finally:
        try:  # whatever the launcher left behind in its session
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if p.poll() is None:
            p.wait()
    assert p.returncode == 0, f"exit {p.returncode}: {' '.join(cmd)}\n{out[-6000:]}"
    return out


def recipe(tmp_path, name: str, *args: str, nproc: int = 1, timeout: int = 180) -> dict:
    """Runs the recipe (nproc > 1: under torchrun); returns rank 0's metrics."""
    out_json = str(tmp_path / f"{name}.json")
    mod = ["-m", "torchtpu.examples.train_llama", *args, "--metrics-json", out_json]
    if nproc == 1:
        cmd = [sys.executable, *mod]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *mod]
    log = _run(cmd, timeout)
    with open(out_json) as f:
        m = json.load(f)
    m["log"] = log
    return m


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory):
    """2 processes on tpu, FSDP2, fp32, DCP checkpoints at steps 3 and 6."""
    tmp = tmp_path_factory.mktemp("llama")
    m = recipe(tmp, "fsdp2", *COMMON, "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "3", nproc=2)
    m["ckpt"] = tmp / "ckpt"
    return m


def test_fsdp2_two_processes_match_one_process_cpu(fsdp2_run, tmp_path):
    cpu = recipe(tmp_path, "cpu", *COMMON, "--device", "cpu")
    tpu = fsdp2_run
    assert tpu["world"] == 2 and tpu["dp"] == 2 and cpu["world"] == 1 and cpu["device"] == "cpu"
    assert len(tpu["losses"]) == len(cpu["losses"]) == 6
    assert tpu["losses"][-1] < tpu["losses"][0] - 0.1, tpu["losses"]
    diff = max(abs(a - b) for a, b in zip(tpu["losses"], cpu["losses"]))
    assert diff < 1e-4, (tpu["losses"], cpu["losses"])


def test_checkpoint_resume_matches_uninterrupted(fsdp2_run, tmp_path):
    # resume from the uninterrupted run's step-3 checkpoint (saved by 2 ranks), in a fresh directory
    ckpt = tmp_path / "ckpt"
    shutil.copytree(fsdp2_run["ckpt"] / "step-3", ckpt / "step-3")
    m = recipe(tmp_path, "resumed", *COMMON, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3", nproc=2)
    assert "resumed from" in m["log"] and m["first_step"] == 3, m["log"][-2000:]
    assert len(m["losses"]) == 3
    for a, b in zip(m["losses"], fsdp2_run["losses"][3:]):
        assert abs(a - b) < 1e-5, (m["losses"], fsdp2_run["losses"])
    assert (ckpt / "step-6" / ".metadata").exists()


def test_stop_after_then_resume(tmp_path):
    # 1 process (CPU/Gloo, the same recipe code): stop after 2 steps (checkpoint at 2), then a new
    # process runs steps 2..3
    args = ["--device", "cpu", "--steps", "4", "--lr", "3e-3", "--log-every", "1", "--peak-tflops", "0.1",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "2"]
    full = recipe(tmp_path, "full", *args[:-4])
    first = recipe(tmp_path, "first", *args, "--stop-after", "2")
    second = recipe(tmp_path, "second", *args)
    assert first["losses"] + second["losses"] == pytest.approx(full["losses"], abs=1e-5)


def test_bf16_activation_checkpointing_loss_falls(tmp_path):
    m = recipe(tmp_path, "bf16", *COMMON, "--steps", "8", "--bf16", "--ac", nproc=2)
    assert "bf16 True, ac True" in m["log"]
    assert m["losses"][-1] < m["losses"][0] - 0.1, m["losses"]
    assert all(math.isfinite(v) for v in m["losses"])


def test_tensor_parallel_matches_fsdp2(fsdp2_run, tmp_path):
    m = recipe(tmp_path, "tp", *COMMON, "--tp", "2", nproc=2)
    assert m["tp"] == 2 and m["dp"] == 1
    for a, b in zip(m["losses"], fsdp2_run["losses"]):
        assert abs(a - b) < 1e-4, (m["losses"], fsdp2_run["losses"])


def test_tokens_per_second_and_mfu_reported(tmp_path):
    m = recipe(tmp_path, "mfu", "--steps", "4", "--log-every", "2")  # the peak is measured on the device
    assert m["peak_source"].startswith("measured") and "GFLOP/s per device (measured" in m["log"]
    for k in ("tokens_per_s", "mfu", "peak_flops", "flops_per_token"):
        assert math.isfinite(m[k]) and m[k] > 0, (k, m[k])
    assert m["mfu"] < 1.0
    for f in m["intervals"]:
        assert f["tokens_per_s"] > 0 and 0 < f["mfu"] < 1.0, f
    assert "tokens/s" in m["log"] and "MFU" in m["log"]
