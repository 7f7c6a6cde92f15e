#!/usr/bin/env bash
# Checks torchtpu on a machine with one NVIDIA GPU, through the CUDA PJRT plugin, inside a
# fixed time budget (default 570 s, for a 10-minute lease): (1) installs the plugin and what
# else is missing, (2) builds torchtpu if this checkout has no usable build, (3) runs a smoke
# program, (4) a bounded subset of the fast test tier, (5) the benchmarks, and (6) prints a
# summary. Every step runs under `timeout`; a step that fails or runs out of time does not
# stop the later ones or the summary. Exit status: 0 when every step passed.
#
#   bash tools/device_check.sh                 on the GPU machine
#   bash tools/device_check.sh fetch [DIR]     on a machine with network: download the wheels
#                                              the GPU machine may lack into DIR (default
#                                              .device-wheels/, git-ignored); carry DIR along
#   DEVICE_CHECK_DRY=1 bash tools/device_check.sh
#                                              the same steps on the CPU plugin, tiny budgets:
#                                              checks the script's plumbing without a GPU
#
# Environment:
#   OUT                        output folder (default ./device-check-out): device_check.log (every
#                              step's output), tests.xml, bench_*.json, summary.json
#   DEVICE_CHECK_WHEELS        wheelhouse to install from with --no-index --find-links (default
#                              .device-wheels/ when it holds wheels; else the package index)
#   DEVICE_CHECK_PLUGIN        cuda (default) or cpu
#   DEVICE_CHECK_PLUGIN_PKG    the CUDA plugin requirement (default xla-cuda13-pjrt==0.0.1, built
#                              from the same XLA as xla-cpu-pjrt 0.0.1); "none": use whichever
#                              CUDA PJRT plugin is installed (torchtpu/_plugin.py's search order)
#   DEVICE_CHECK_TORCH_INDEX   index for torch==2.13.0 when no wheelhouse is given and another
#                              torch is installed (default https://download.pytorch.org/whl/cpu:
#                              torchtpu needs no CUDA build of torch)
#   DEVICE_CHECK_TOTAL         seconds for the whole check (default 570; dry 300)
#   DEVICE_CHECK_TESTS         pytest arguments of the test step (default: a bounded subset)
#   DEVICE_CHECK_TEST_BUDGET   seconds for the test step (default 200); DEVICE_CHECK_TEST_TIMEOUT
#                              seconds one test may take (default 60)
#   DEVICE_CHECK_BENCHES       benchmarks to run (default "eager compile lowp")
#   DEVICE_CHECK_PYVER         fetch: the GPU machine's Python version (default 3.12)
#   PYTHON                     interpreter (default python3)
set -uo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
SELF="$REPO/tools/device_check.sh"
PY=${PYTHON:-python3}
DRY=${DEVICE_CHECK_DRY:-0}
[ "$DRY" = 0 ] && PLUGIN=${DEVICE_CHECK_PLUGIN:-cuda} || PLUGIN=${DEVICE_CHECK_PLUGIN:-cpu}
PLUGIN_PKG=${DEVICE_CHECK_PLUGIN_PKG:-xla-cuda13-pjrt==0.0.1}
TORCH_REQ=torch==2.13.0
TORCH_INDEX=${DEVICE_CHECK_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
WHEELS=${DEVICE_CHECK_WHEELS:-}
if [ -z "$WHEELS" ] && ls "$REPO"/.device-wheels/*.whl >/dev/null 2>&1; then
  WHEELS="$REPO/.device-wheels"
fi
export TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONUNBUFFERED=1 TORCHTPU_PLUGIN="$PLUGIN"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# ---------------------------------------------------------------- fetch (network side)
if [ "${1:-}" = fetch ]; then
  DIR=${2:-$REPO/.device-wheels}
  mkdir -p "$DIR"
  plat=(--only-binary=:all: --implementation cp --python-version "${DEVICE_CHECK_PYVER:-3.12}"
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  set -e
  # The CUDA plugin (88 MB), the CPU plugin (63 MB; some tests use it) and pytest-timeout;
  # torch 2.13.0 unless DEVICE_CHECK_FETCH_TORCH=0.
  "$PY" -m pip download -q --no-deps "${plat[@]}" -d "$DIR" "$PLUGIN_PKG" xla-cpu-pjrt==0.0.1 pytest-timeout
  if [ "${DEVICE_CHECK_FETCH_TORCH:-1}" != 0 ]; then
    # The CPU build (about 190 MB) from PyTorch's index; where that is unreachable, the
    # default index's build (527 MB; its CUDA libraries are not fetched).
    "$PY" -m pip download -q --no-deps "${plat[@]}" -d "$DIR" --index-url "$TORCH_INDEX" "$TORCH_REQ" \
      || "$PY" -m pip download -q --no-deps "${plat[@]}" -d "$DIR" "$TORCH_REQ"
  fi
  ls -la "$DIR"
  exit 0
fi

# ---------------------------------------------------------------- steps (run under timeout)
pip_install() {  # pip_install REQ...: from the wheelhouse if there is one
  local src=()
  [ -n "$WHEELS" ] && src=(--no-index --find-links "$WHEELS")
  "$PY" -m pip install -q --disable-pip-version-check --no-input "${src[@]}" "$@"
}

# Loads torchtpu/_plugin.py alone (torchtpu itself may not be built yet).
PLUGIN_PY="import importlib.util as u; s = u.spec_from_file_location('tt_plugin', '$REPO/torchtpu/_plugin.py'); P = u.module_from_spec(s); s.loader.exec_module(P)"

case "${1:-}" in
  _install)
    tv=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || echo none)
    echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)'); torch: $tv"
    rc=0
    # torchtpu builds against the installed torch: 2.13/2.14 are tested; an older
    # one (the GPU image's 2.11, no network there) builds too (checked: 2.11.0,
    # README "Torch versions"). Only a machine without torch installs one.
    if [ "$tv" = none ]; then
      echo "installing $TORCH_REQ (no torch found)"
      if [ -n "$WHEELS" ]; then
        # A wheelhouse holds torch alone: its pinned dependencies may differ from those here.
        pip_install "$TORCH_REQ" || pip_install --no-deps "$TORCH_REQ" || rc=1
      else "$PY" -m pip install -q --disable-pip-version-check --index-url "$TORCH_INDEX" "$TORCH_REQ" || rc=1; fi
    fi
    "$PY" -c 'import pytest_timeout' 2>/dev/null || pip_install pytest-timeout || rc=1
    "$PY" -c 'import xla_plugins.xla_cpu_pjrt' 2>/dev/null || pip_install xla-cpu-pjrt \
      || echo "warning: xla-cpu-pjrt not installed (tests that compare with the CPU plugin will fail)"
    if [ "$PLUGIN_PKG" != none ]; then
      mod=$(echo "${PLUGIN_PKG%%[=<>]*}" | tr - _)
      if "$PY" -c "import xla_plugins.$mod" 2>/dev/null; then echo "$PLUGIN_PKG: already installed"
      else
        echo "installing $PLUGIN_PKG${WHEELS:+ from $WHEELS}"
        # Failing that, whichever CUDA plugin is installed serves (checked below).
        pip_install "$PLUGIN_PKG" || echo "warning: could not install $PLUGIN_PKG"
      fi
    fi
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|xla|jax|nvidia-(cuda-runtime|cublas|cudnn))' || true
    # Which plugin TORCHTPU_PLUGIN resolves to, and whether its shared libraries load (the
    # same preloading torchtpu does; loading starts no device).
    "$PY" - <<EOF || rc=1
$PLUGIN_PY
import ctypes
kind, path = P.resolve("$PLUGIN")
print("plugin:", kind, path)
try:
    ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    print("plugin library loads")
except OSError as e:
    raise SystemExit(f"plugin library does not load: {e}")
EOF
    if [ "$PLUGIN" != cuda ] && [ "$PLUGIN_PKG" != none ]; then
      # dry run: the CUDA plugin was installed above; report what resolving and loading it
      # give here (without a GPU: a missing CUDA library or driver), failing nothing.
      "$PY" - <<EOF || true
$PLUGIN_PY
import ctypes
try:
    kind, path = P.resolve("cuda")
    print("cuda plugin (not used in this run):", path)
    ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    print("cuda plugin library loads")
except (ImportError, OSError) as e:
    print("cuda plugin (not used in this run):", e)
EOF
    fi
    exit $rc ;;
  _build)
    if "$PY" -c 'import torchtpu._C' 2>/dev/null; then
      echo "torchtpu is built: $("$PY" -c 'import torchtpu._C as c; print(c.__file__)')"
      exit 0
    fi
    echo "building torchtpu (cmake + ninja, build/device-check)"
    command -v cmake >/dev/null && command -v ninja >/dev/null \
      || pip_install cmake ninja || exit 1
    cmake -S "$REPO" -B "$REPO/build/device-check" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTORCHTPU_BUILD_TESTS=OFF -DTORCHTPU_ALLOW_ANY_TORCH=ON -DPython3_EXECUTABLE="$(command -v "$PY")" || exit 1
    ninja -C "$REPO/build/device-check" || exit 1
    "$PY" -c 'import torchtpu._C'
    exit ;;
  _smoke)
    "$PY" -c '
import time
t0 = time.perf_counter()
import torch, torchtpu
x = torch.randn(64, 64, device="tpu")
y = x @ x
print("smoke:", y.sum().item(), torch.tpu.get_device_name(), "| plugin:", torchtpu._plugin_kind, torchtpu._plugin_path)
ref = x.cpu() @ x.cpu()
err = (y.cpu() - ref).abs().max().item() / ref.abs().max().item()
print("smoke: max error vs CPU %.2e (relative to the largest entry) | %.1f s to first result"
      % (err, time.perf_counter() - t0))
assert err < 1e-2, err  # TF32-level agreement at least
'
    exit ;;
esac

# ---------------------------------------------------------------- the check
OUT=${OUT:-$REPO/device-check-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/device_check.log"
: > "$LOG"
rm -f "$OUT"/tests.xml "$OUT"/bench_*.json "$OUT"/summary.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
STEPS="$TMP/steps.tsv"
: > "$STEPS"

if [ "$DRY" = 0 ]; then
  TOTAL=${DEVICE_CHECK_TOTAL:-570}
  TEST_BUDGET=${DEVICE_CHECK_TEST_BUDGET:-200}
  # In order of interest: what runs out of time is cut from the end (about 130 s on XLA:CPU).
  TESTS=${DEVICE_CHECK_TESTS:-tests/test_basic.py tests/test_device.py tests/test_ops_nn.py tests/test_ops_train.py tests/test_views.py tests/test_copy.py tests/test_errors.py}
  EAGER_ARGS=(--steps 10); COMPILE_ARGS=(--steps 8 --batches 2); LOWP_ARGS=(--steps 5)
  BUDGET_install=150; BUDGET_build=300; BUDGET_smoke=120
  BUDGET_eager=75; BUDGET_compile=150; BUDGET_lowp=90
else
  TOTAL=${DEVICE_CHECK_TOTAL:-300}
  TEST_BUDGET=${DEVICE_CHECK_TEST_BUDGET:-60}
  TESTS=${DEVICE_CHECK_TESTS:-tests/test_basic.py tests/test_device.py}
  EAGER_ARGS=(--steps 3); COMPILE_ARGS=(--steps 4 --batches 2); LOWP_ARGS=(--steps 1)
  BUDGET_install=120; BUDGET_build=300; BUDGET_smoke=60
  BUDGET_eager=90; BUDGET_compile=150; BUDGET_lowp=120
fi
TEST_TIMEOUT=${DEVICE_CHECK_TEST_TIMEOUT:-60}
BENCHES=${DEVICE_CHECK_BENCHES:-eager compile lowp}
START=$(date +%s)
DEADLINE=$((START + TOTAL))

# step NAME BUDGET SIGNAL CMD...: runs CMD under timeout (at most BUDGET seconds and what is
# left of the total), logs its output, records name/status/rc/seconds.
step() {
  local name=$1 budget=$2 sig=$3
  shift 3
  local left=$((DEADLINE - $(date +%s) - 5))
  local t=$((budget < left ? budget : left))
  if [ "$t" -lt 10 ]; then
    echo "== $name: skipped, no time left" | tee -a "$LOG"
    printf '%s\tskipped\t-\t0\n' "$name" >> "$STEPS"
    return 1
  fi
  echo "== $name (limit ${t} s, $(date -u +%H:%M:%S))" | tee -a "$LOG"
  local t0 rc status
  t0=$(date +%s)
  (cd "$REPO" && timeout -s "$sig" -k 15 "$t" "$@") > "$TMP/$name.log" 2>&1
  rc=$?
  cat "$TMP/$name.log" >> "$LOG"
  case $rc in
    0) status=passed ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  echo "   $status (rc $rc) in $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
  [ "$rc" = 0 ] || sed 's/^/   | /' "$TMP/$name.log" | tail -15
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$(( $(date +%s) - t0 ))" >> "$STEPS"
  return "$rc"
}

echo "device_check: plugin=$PLUGIN total=${TOTAL}s wheels=${WHEELS:-<index>} out=$OUT" | tee -a "$LOG"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"

step install "$BUDGET_install" TERM bash "$SELF" _install
step build "$BUDGET_build" TERM bash "$SELF" _build
step smoke "$BUDGET_smoke" TERM bash "$SELF" _smoke
# SIGINT at the step's limit: pytest stops and still writes the junit XML of what ran.
# shellcheck disable=SC2086
step tests "$TEST_BUDGET" INT bash -c "exec \"\$0\" -m pytest -q -p no:cacheprovider -m 'not slow' \
  --timeout=$TEST_TIMEOUT --junitxml='$OUT/tests.xml' $TESTS" "$PY"
for b in $BENCHES; do
  case $b in
    eager) args=("${EAGER_ARGS[@]}"); budget=$BUDGET_eager ;;
    compile) args=("${COMPILE_ARGS[@]}"); budget=$BUDGET_compile ;;
    lowp) args=("${LOWP_ARGS[@]}"); budget=$BUDGET_lowp ;;
    *) args=(); budget=90 ;;
  esac
  if [ ! -f "$REPO/benchmarks/bench_$b.py" ]; then
    echo "== bench_$b: no benchmarks/bench_$b.py" | tee -a "$LOG"
    continue
  fi
  step "bench_$b" "$budget" TERM "$PY" "benchmarks/bench_$b.py" "${args[@]}" --json "$OUT/bench_$b.json"
done

# ---------------------------------------------------------------- summary
"$PY" - "$OUT" "$STEPS" "$PLUGIN" "$(( $(date +%s) - START ))" <<'EOF'
import json, os, sys
import xml.etree.ElementTree as ET

out, steps_file, plugin, wall = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
steps = []
for line in open(steps_file):
    name, status, rc, secs = line.rstrip("\n").split("\t")
    steps.append({"step": name, "status": status, "rc": rc, "seconds": int(secs)})
summary = {"plugin": plugin, "wall_seconds": wall, "steps": steps}

log = open(os.path.join(out, "device_check.log"), errors="replace").read().splitlines()
smoke = [l for l in log if l.startswith("smoke:")]
if smoke:
    summary["smoke"] = smoke

xml = os.path.join(out, "tests.xml")
if os.path.exists(xml):
    try:
        root = ET.parse(xml).getroot()
        suites = [root] if root.tag == "testsuite" else list(root)
        t = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
        t["passed"] = t["tests"] - t["failures"] - t["errors"] - t["skipped"]
        t["failed_ids"] = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s.iter("testcase")
                           if c.find("failure") is not None or c.find("error") is not None][:40]
        summary["tests"] = t
    except ET.ParseError as e:
        summary["tests"] = {"error": f"tests.xml unreadable: {e}"}


def get(d, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


FIGS = {
    "eager": [("op_overhead", "tpu_add_dispatch_us"), ("op_overhead", "tpu_add_with_sync_us"),
              ("op_overhead", "overhead_ratio"), ("compile_time", "ms_per_compile"),
              ("gpt_step", "tpu_median_step_ms"), ("gpt_step", "cpu_median_step_ms"),
              ("gpt_step", "tpu_over_cpu_step_time"), ("gpt_step", "programs_per_step"),
              ("gpt_step", "cpu_fallbacks")],
    "compile": [("batch_2", "tpu_compiled", "median_step_ms"), ("batch_2", "tpu_strict", "median_step_ms"),
                ("batch_2", "cpu_eager", "median_step_ms"), ("batch_2", "ratios", "compiled_speedup_vs_strict"),
                ("batch_2", "ratios", "compiled_speedup_vs_cpu_eager"),
                ("batch_2", "ratios", "compiled_host_fraction"),
                ("start", "cold", "compile_seconds"), ("start", "cold", "first_step_end_s"),
                ("start", "warm", "first_step_end_s")],
    "lowp": [("model", "bf16", "step_ms_strict"), ("model", "fp8", "step_ms_strict"),
             ("model", "mxfp4", "step_ms_strict"), ("model", "fp8", "max_logit_diff_vs_bf16"),
             ("model", "mxfp4", "max_logit_diff_vs_bf16"), ("matmul", "M=64", "bf16_mm"),
             ("matmul", "M=64", "fp8_scaled_mm"), ("matmul", "M=64", "fp8_scaled_mm_vs_bf16"),
             ("cpu_fallbacks_in_quantized_steps",)],
}
figs = {}
for b, paths in FIGS.items():
    p = os.path.join(out, f"bench_{b}.json")
    if not os.path.exists(p):
        continue
    try:
        res = json.load(open(p))
    except ValueError:
        continue
    figs[b] = {".".join(k): get(res, *k) for k in paths}
summary["figures"] = figs
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)

print(f"\n==== device_check summary (TORCHTPU_PLUGIN={plugin}, {wall} s)")
for s in steps:
    print(f"  {s['step']:<14} {s['status']:<8} {s['seconds']:>4} s")
for l in smoke:
    print("  " + l)
if "tests" in summary:
    t = summary["tests"]
    if "error" in t:
        print("  tests:", t["error"])
    else:
        print(f"  tests: {t['passed']} passed, {t['failures']} failed, {t['errors']} errors, "
              f"{t['skipped']} skipped (of {t['tests']} run)")
        for i in t["failed_ids"][:15]:
            print("    FAILED", i)
for b, f in figs.items():
    print(f"  bench_{b}:")
    for k, v in f.items():
        if v is not None:
            print(f"    {k} = {round(v, 4) if isinstance(v, float) else v}")
print(f"  output: {out}")
sys.exit(0 if steps and all(s["status"] == "passed" for s in steps) else 1)
EOF
