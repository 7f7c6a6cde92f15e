#!/usr/bin/env bash
# Runs transformers' own model tests on "tpu" and on CPU and compares them.
#
#   tools/hf_suite.sh SRC OUT MODEL...       e.g. tools/hf_suite.sh /work/hf-tests /tmp/hf-out llama gpt2
#
# SRC: a directory holding a version-consistent set of transformers test sources
#      (SRC/tests/test_modeling_common.py, SRC/tests/models/<model>/test_modeling_<model>.py, ...;
#      docs/hf-suite.md says how to assemble one). Nothing is fetched at run time.
# OUT: where the junit XML, the logs and the summary (OUT/summary.md) go.
#
# Environment:
#   HF_SUITE_DEVICES        devices to run, in order (default "cpu tpu")
#   HF_SUITE_TEST_TIMEOUT   seconds one test may take (pytest-timeout; default 300)
#   HF_SUITE_MODEL_TIMEOUT  seconds one model may take on one device (default 900); past it
#                           pytest is interrupted and what ran is still reported
#   HF_SUITE_PYTEST_ARGS    extra pytest arguments (e.g. "-k test_model_")
#   PYTHON                  the interpreter (default python3)
set -euo pipefail

if [ $# -lt 3 ]; then
  sed -n '2,20p' "$0" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
SRC=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
shift 2
PY=${PYTHON:-python3}
DEVICES=${HF_SUITE_DEVICES:-cpu tpu}
TEST_TIMEOUT=${HF_SUITE_TEST_TIMEOUT:-300}
MODEL_TIMEOUT=${HF_SUITE_MODEL_TIMEOUT:-900}

[ -f "$SRC/tests/test_modeling_common.py" ] || { echo "hf_suite: $SRC/tests/test_modeling_common.py not found" >&2; exit 2; }
"$PY" -c "import pytest_timeout" 2>/dev/null \
  || { echo "hf_suite: needs pytest-timeout (pip install pytest-timeout torch==2.13.0)" >&2; exit 2; }

# transformers imports TRANSFORMERS_TEST_DEVICE_SPEC by a module name made from the path, so
# the spec is a file in the directory pytest runs from that re-exports torchtpu.testing.
RUN="$OUT/run"
mkdir -p "$RUN"
echo "from torchtpu.testing import *  # noqa: F401,F403" > "$RUN/torchtpu_device_spec.py"

for model in "$@"; do
  test_file="$SRC/tests/models/$model/test_modeling_$model.py"
  if [ ! -f "$test_file" ]; then
    echo "hf_suite: $test_file not found; skipping $model" >&2
    continue
  fi
  for device in $DEVICES; do
    # This checkout's torchtpu, loaded first (-p torchtpu) as an installed one's autoload
    # would be: transformers caches whether an accelerator exists the first time it asks.
    env_args=(TORCH_DEVICE_BACKEND_AUTOLOAD=0 "PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}"
              HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false)
    case "$device" in
      cpu) env_args+=(TRANSFORMERS_TEST_DEVICE=cpu) ;;
      tpu) env_args+=(TRANSFORMERS_TEST_DEVICE_SPEC=torchtpu_device_spec.py) ;;
      *) echo "hf_suite: unknown device $device" >&2; exit 2 ;;
    esac
    xml="$OUT/$model-$device.xml"
    log="$OUT/$model-$device.log"
    rm -f "$xml"
    echo "== $model on $device ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    # SIGINT at the model limit: pytest stops and still writes the junit XML of what ran.
    # shellcheck disable=SC2086
    (cd "$RUN" && env "${env_args[@]}" timeout -s INT -k 60 "$MODEL_TIMEOUT" \
        "$PY" -m pytest -p torchtpu -p no:cacheprovider --rootdir="$SRC" -c "$SRC/pyproject.toml" \
        -o addopts="" -o log_cli=false -q -rN --timeout="$TEST_TIMEOUT" \
        --junitxml="$xml" ${HF_SUITE_PYTEST_ARGS:-} "$test_file") >"$log" 2>&1 || true
    echo "   $(( $(date +%s) - start )) s: $(tail -1 "$log")"
  done
done

"$PY" "$REPO/tools/hf_suite_report.py" "$OUT" > "$OUT/summary.md"
echo "summary: $OUT/summary.md"
