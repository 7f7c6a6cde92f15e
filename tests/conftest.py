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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not os.environ.get("TORCHTPU_TPU_CHECK"):
        return
    import torchtpu.aot

    r = torchtpu.aot.check_report(wait=True)
    terminalreporter.write_line(
        f"TPU check ({r['topology']}): {r['programs']} programs compiled for TPU in {r['seconds']:.1f} s, "
        f"{r['failures']} failed; largest temp {r['max_temp_bytes']} B, peak {r['max_peak_bytes']} B")
    for f in r["failed"]:
        terminalreporter.write_line(f"  FAILED [{f['ops']}]: {f['error'].splitlines()[0][:300]}")
    for sec, ops in r["slowest"]:
        terminalreporter.write_line(f"  slowest: {sec:.2f} s [{ops[:200]}]")


def pytest_sessionfinish(session, exitstatus):
    import torchtpu.aot

    if os.environ.get("TORCHTPU_TPU_CHECK") and torchtpu.aot.check_report(wait=True)["failures"]:
        session.exitstatus = 1
