"""torch.distributed on "tpu": the c10d backend over 2 processes (tests/dist_worker.py).

Each scenario runs in 2 fresh processes on the XLA CPU plugin and checks its
results against a reference in the same processes (a Gloo group on CPU
tensors, or a single-device run). Every process is killed at the end, and
every launch has a deadline.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "dist_worker.py")

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with Gloo is not available")


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    e.pop("LOCAL_RANK", None)
    e["OMP_NUM_THREADS"] = "1"
    return e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _communicate_all(procs, timeout):
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            left = max(1.0, deadline - time.monotonic())
            outs.append(p.communicate(timeout=left)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        texts = [p.communicate()[0] for p in procs]
        pytest.fail(f"distributed test timed out after {timeout}s:\n" + "\n----\n".join(t[-3000:] for t in texts))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def launch(scenario: str, world: int = 2, timeout: int = 240) -> list[str]:
    """Runs `scenario` on `world` processes; returns each rank's output; fails unless all printed OK."""
    with tempfile.TemporaryDirectory(prefix="tt-dist-") as tmp:
        env = _env()
        env["TEST_PORT"] = str(_free_port())
        procs = [subprocess.Popen([sys.executable, WORKER, scenario, str(r), str(world), tmp], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
        outs = _communicate_all(procs, timeout)
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and out.rstrip().endswith("OK"), f"rank {r} (exit {p.returncode}):\n{out[-6000:]}"
    return outs


def test_collectives_match_gloo_on_cpu():
    launch("collectives")


def test_premul_sum_in_every_reducing_collective_and_fsdp2_divide_factor():
    launch("premul_sum")


@pytest.mark.slow
def test_collectives_4_processes():
    launch("collectives", world=4, timeout=480)


def test_init_process_group_variants_and_device_mesh():
    launch("init_variants")


def test_ddp_gpt_matches_single_process_and_cpu():
    launch("ddp")


def test_fsdp2_matches_single_process_mixed_precision_and_checkpoint():
    launch("fsdp", timeout=300)


def test_dtensor_redistribute_and_tensor_parallel_mlp():
    launch("dtensor")


def test_dead_rank_raises_within_timeout():
    t0 = time.monotonic()
    # rank 1 exits on purpose: only rank 0's output must say OK
    with tempfile.TemporaryDirectory(prefix="tt-dist-") as tmp:
        procs = [subprocess.Popen([sys.executable, WORKER, "dead_rank", str(r), "2", tmp], env=_env(), cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = _communicate_all(procs, 90)
    assert procs[0].returncode == 0 and "ERROR after" in outs[0], outs[0][-3000:]
    assert time.monotonic() - t0 < 60


def test_hung_rank_raises_after_the_timeout():
    with tempfile.TemporaryDirectory(prefix="tt-dist-") as tmp:
        procs = [subprocess.Popen([sys.executable, WORKER, "hung_rank", str(r), "2", tmp], env=_env(), cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = _communicate_all(procs, 90)
    assert procs[0].returncode == 0 and "ERROR after" in outs[0], outs[0][-3000:]
    waited = float(outs[0].split("ERROR after ")[1].split("s")[0])
    assert 4.0 <= waited < 15.0, outs[0]  # the group's timeout is 5 s


def test_torchrun_picks_device_from_local_rank():
    # --tee 3: torchrun relays each rank's output line by line (whole lines,
    # prefixed by rank), so the two ranks' prints cannot interleave mid-line
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "--tee", "3", WORKER, "torchrun"]
    p = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out = p.communicate(timeout=180)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out = p.communicate()[0]
        pytest.fail("torchrun timed out:\n" + out[-4000:])
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    assert p.returncode == 0, out[-4000:]
    assert "OK 0 TFRT_CPU_0" in out and "OK 1 TFRT_CPU_1" in out, out[-4000:]


@pytest.mark.parametrize("visible,local,requested,expected", [
    ("", None, None, 0), ("", "3", None, 3), ("", "3", 1, 1), ("5", "1", None, 5),
    ("4,5,6,7", "2", None, 6), ("4,5,6,7", None, 1, 5), ("4, 5", "0", None, 4)])
def test_physical_device_index(visible, local, requested, expected):
    import torchtpu

    assert torchtpu._physical_index(visible, local, requested) == expected


def test_physical_device_index_out_of_range():
    import torchtpu

    with pytest.raises(ValueError, match="TORCHTPU_VISIBLE_DEVICES"):
        torchtpu._physical_index("4,5", "2", None)
