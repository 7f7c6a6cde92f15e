#!/usr/bin/env bash
# The vLLM tier: vLLM 0.33.0 (a source build, tools/install_vllm.sh) in a venv of
# its own (vLLM pins transformers<5.21; the main tests use 5.23), torchtpu from
# this checkout (its torch 2.13.0 build: run after tools/test.sh), then
# tests/vllm (offline LLM, `vllm serve`, the attention backend).
#   bash tools/test_vllm.sh      (venv: TORCHTPU_VLLM_VENV, default ~/.cache/torchtpu/venv-vllm)
#   bash tools/test_vllm.sh --runslow   also the variants marked slow (more families in bf16,
#                                 eager TP 2, per-channel FP8): CI runs the default set
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TORCHTPU_VLLM_VENV:-$HOME/.cache/torchtpu/venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PYTHON="$VENV/bin/python" bash tools/install_vllm.sh
TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONPATH="$PWD" "$VENV/bin/python" -c 'import torchtpu._C' \
  || { echo "test_vllm: this checkout's torchtpu/_C is not a torch 2.13.0 build: run bash tools/test.sh first" >&2; exit 1; }
source tools/xdist.sh
xdist_args "$VENV/bin/python"
PYTHONPATH="$PWD" "$VENV/bin/python" -m pytest -q -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"} "$@" tests/vllm
