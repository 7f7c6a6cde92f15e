import json
import os
import subprocess
import sys
import tempfile
import warnings

# Import torchtpu explicitly from this checkout: an installed torchtpu's
# torch.backends entry point (possibly another version) must not load first.
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# Compile-count assertions assume every new program compiles on first use:
# strict mode's host tier is off unless a test turns it on (host_tier fixture).
os.environ.setdefault("TORCHTPU_HOST_TIER", "0")
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
def host_tier():
    """Strict mode's host tier on (2 runs before compiling), as users get it."""
    prev = torchtpu._C._set_host_tier_runs(2)
    yield
    torchtpu._C._set_host_tier_runs(prev)


@pytest.fixture
def metrics():
    """Resets torchtpu's counters; the test reads torchtpu.metrics() afterwards."""
    torchtpu.reset_metrics()
    yield torchtpu.metrics


# --- OpInfo sweep options (tests/test_opinfo.py) ----------------------------------------------


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="i/n",
                     help="run only shard i (0-based) of n of the collected tests, e.g. --shard 0/4")
    parser.addoption("--runslow", action="store_true", default=False,
                     help="run tests marked slow (also enabled by -m expressions naming 'slow')")


def pytest_collection_modifyitems(config, items):
    mexpr = config.getoption("-m") or ""
    if not config.getoption("--runslow") and not ("slow" in mexpr and "not slow" not in mexpr):
        skip = pytest.mark.skip(reason="slow: use --runslow or -m slow")
        for it in items:
            if "slow" in it.keywords:
                it.add_marker(skip)
    shard = config.getoption("--shard")
    if shard:
        i, n = (int(x) for x in shard.split("/"))
        if not (0 <= i < n):
            raise pytest.UsageError(f"--shard {shard}: need 0 <= i < n")
        keep, drop = [], []
        for k, it in enumerate(items):
            (keep if k % n == i else drop).append(it)
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep


# --- TORCHTPU_TPU_CHECK=<topology> (torchtpu.aot.check): every program also compiled for a TPU ---


_TPU_REPORTS = []  # xdist: each worker's check report, collected by the controller


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown where xdist is not installed
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", {}).get("tpu_check")
    if out:
        _TPU_REPORTS.append(json.loads(out))


def _tpu_check_report(config) -> dict:
    """This process's report merged with every xdist worker's (tests run in workers)."""
    import torchtpu.aot

    reports = [torchtpu.aot.check_report(wait=True), *_TPU_REPORTS]
    merged = dict(reports[0])
    for k in ("programs", "seconds", "failures"):
        merged[k] = sum(r[k] for r in reports)
    for k in ("max_temp_bytes", "max_peak_bytes"):
        merged[k] = max(r[k] for r in reports)
    merged["failed"] = [f for r in reports for f in r["failed"]]
    merged["slowest"] = sorted((tuple(x) for r in reports for x in r["slowest"]), reverse=True)[:5]
    return merged


def pytest_sessionfinish(session, exitstatus):
    if not os.environ.get("TORCHTPU_TPU_CHECK"):
        return
    config = session.config
    if hasattr(config, "workerinput"):  # an xdist worker: hand the report to the controller
        import torchtpu.aot

        config.workeroutput["tpu_check"] = json.dumps(torchtpu.aot.check_report(wait=True))
        return
    config._tpu_check_report = r = _tpu_check_report(config)
    if r["failures"] or (session.testscollected and not r["programs"]):
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    r = getattr(config, "_tpu_check_report", None)
    if r is None:
        return
    terminalreporter.write_line(
        f"TPU check ({r['topology']}): {r['programs']} programs compiled for TPU in {r['seconds']:.1f} s, "
        f"{r['failures']} failed; largest temp {r['max_temp_bytes']} B, peak {r['max_peak_bytes']} B")
    if not r["programs"]:
        terminalreporter.write_line("  FAILED: tests ran but no program was compiled for TPU")
    for f in r["failed"]:
        terminalreporter.write_line(f"  FAILED [{f['ops']}]: {f['error'].splitlines()[0][:300]}")
    for sec, ops in r["slowest"]:
        terminalreporter.write_line(f"  slowest: {sec:.2f} s [{ops[:200]}]")
