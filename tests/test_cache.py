"""The persistent compilation cache: reuse across restarts, safety, bounds."""
import json
import os

import pytest

PROG = r"""
import json, torch, torchtpu
x = torch.arange(12, dtype=torch.float32).to("tpu").view(3, 4)
y = (x * 2 + 1).t().contiguous().sum(0)
assert y.cpu().tolist() == (torch.arange(12.).view(3, 4) * 2 + 1).t().contiguous().sum(0).tolist()
if COMPILE:
    f = torch.compile(lambda a: torch.tanh(a @ a.T) * 3, backend="tpu")
    f(x).cpu()
m = torchtpu.metrics()
print(json.dumps({"compiles": m["compiles"], "disk": m["disk_cache_hits"]}))
"""


def _run(pyrun, cache_dir, compile_graph=False, extra_env=None):
    # strict mode: one program per op, so the test has several entries to corrupt
    env = {"TORCHTPU_CACHE_DIR": cache_dir, "TORCHTPU_MODE": "strict"}
    env.update(extra_env or {})
    r = pyrun("COMPILE = %s\n" % compile_graph + PROG, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _entries(d):
    return [f for f in os.listdir(d) if f.endswith(".ttx")] if os.path.isdir(d) else []


def test_restart_reuses_compiled_programs(pyrun, tmp_path):
    d = str(tmp_path / "cache")
    cold = _run(pyrun, d, compile_graph=True)
    assert cold["compiles"] > 0 and cold["disk"] == 0
    assert len(_entries(d)) == cold["compiles"]
    warm = _run(pyrun, d, compile_graph=True)
    assert warm["compiles"] == 0
    assert warm["disk"] == cold["compiles"]


def test_corrupt_and_truncated_entries_are_rebuilt(pyrun, tmp_path):
    d = str(tmp_path / "cache")
    cold = _run(pyrun, d)
    files = sorted(_entries(d))
    assert files
    with open(os.path.join(d, files[0]), "r+b") as f:  # truncate
        f.truncate(20)
    with open(os.path.join(d, files[1]), "r+b") as f:  # flip payload bytes
        f.seek(60)
        f.write(b"\xff" * 16)
    warm = _run(pyrun, d)
    assert warm["compiles"] == 2
    assert warm["disk"] == cold["compiles"] - 2
    again = _run(pyrun, d)
    assert again["compiles"] == 0


def test_concurrent_processes_share_the_directory(pyrun, tmp_path):
    import subprocess
    import sys

    d = str(tmp_path / "cache")
    from conftest import ROOT

    env = dict(os.environ, TORCHTPU_CACHE_DIR=d, PYTHONPATH=ROOT, TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               TORCHTPU_MODE="strict")
    procs = [subprocess.Popen([sys.executable, "-c", "COMPILE = False\n" + PROG], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
    assert not [f for f in os.listdir(d) if f.startswith(".tmp")]
    warm = _run(pyrun, d)
    assert warm["compiles"] == 0


def test_size_bound_evicts_least_recently_used(pyrun, tmp_path):
    d = str(tmp_path / "cache")
    _run(pyrun, d, extra_env={"TORCHTPU_CACHE_MAX_BYTES": "6000"})
    total = sum(os.path.getsize(os.path.join(d, f)) for f in _entries(d))
    assert 0 < total <= 6000


def test_empty_dir_setting_disables_the_cache(pyrun, tmp_path):
    r = _run(pyrun, "", compile_graph=False)
    assert r["disk"] == 0 and r["compiles"] > 0
    r2 = _run(pyrun, "")
    assert r2["compiles"] == r["compiles"]


def test_info_and_clear(pyrun, tmp_path):
    d = str(tmp_path / "cache")
    _run(pyrun, d)
    code = ("import json, torchtpu.cache as c; i = c.info(); n = c.clear(); "
            "print(json.dumps([i, n, c.info()]))")
    r = pyrun(code, env={"TORCHTPU_CACHE_DIR": d, "TORCHTPU_MODE": "strict"})
    assert r.returncode == 0, r.stderr
    info, n, after = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["entries"] == n > 0 and info["bytes"] > 0 and info["directory"] == d
    assert after["entries"] == 0
