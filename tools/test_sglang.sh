#!/usr/bin/env bash
# The SGLang tier: SGLang 0.5.23 (tools/install_sglang.sh: --no-deps plus its pure-Python
# requirements) in a venv of its own on torch 2.14.1 (what SGLang pins; it also pins
# transformers 5.19), torchtpu from this checkout (its torch 2.14.1 build: run after
# `TORCH=2.14.1 bash tools/test.sh`), then tests/sglang (sgl.Engine, launch_server, --tp 2).
#   bash tools/test_sglang.sh      (venv: TORCHTPU_SGLANG_VENV, default ~/.cache/torchtpu/venv-sglang)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TORCHTPU_SGLANG_VENV:-$HOME/.cache/torchtpu/venv-sglang}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PYTHON="$VENV/bin/python" bash tools/install_sglang.sh
TORCH_DEVICE_BACKEND_AUTOLOAD=0 PYTHONPATH="$PWD" "$VENV/bin/python" -c 'import torchtpu, torch; torch.ones(1, device="tpu")' \
  || { echo "test_sglang: this checkout's torchtpu/_C is not a torch 2.14.1 build: run TORCH=2.14.1 bash tools/test.sh first" >&2; exit 1; }
source tools/xdist.sh
xdist_args "$VENV/bin/python"
PYTHONPATH="$PWD" "$VENV/bin/python" -m pytest -q -p no:cacheprovider ${XDIST[@]+"${XDIST[@]}"} -m "not slow" tests/sglang
