#!/usr/bin/env bash
# Install SGLang 0.5.23 next to torch 2.14.1 (what its wheel pins), for torchtpu's SGLang
# platform plugin (torchtpu/sglang, docs/sglang.md).
#
#   python3 -m venv /path/to/venv
#   PYTHON=/path/to/venv/bin/python bash tools/install_sglang.sh
#
# SGLang's wheel requires CUDA-only packages (flashinfer, sglang-kernel, cuda-python, cutlass-dsl,
# deep-ep, flash-mla, tilelang, ...) and has no CPU extra: install it with --no-deps, then its
# pure-Python requirements (the list below, read from the wheel's METADATA, pins kept), triton
# (sglang/srt/utils/common.py imports it unconditionally; the PyPI wheel imports without a GPU) and
# PyPI's torchvision 0.29.x, the release matching PyPI's torch 2.14.1 (sglang's configs import it).
# Use a venv of its own: SGLang pins transformers 5.19.0; the main tests use 5.23.0.
# Idempotent. TORCHTPU_INSTALL=1: also builds and installs this checkout's torchtpu into the venv
# (for torch 2.14.1, build dir build/torch2.14.1), declaring its entry points. Otherwise, when
# torchtpu is not pip-installed for $PYTHON (a source tree on PYTHONPATH, as tools/test_sglang.sh
# runs it), a tiny distribution "torchtpu-sglang-dev" declares torchtpu's SGLang entry points.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.14.1"
PIP=("$PYTHON" -m pip install -q --disable-pip-version-check)

if ! "$PYTHON" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("sglang") == "0.5.23" else 1)' 2>/dev/null; then
  "${PIP[@]}" "$TORCH_PIN" "torchvision==0.29.*" triton xla-cpu-pjrt numpy pytest pytest-xdist scikit-build-core ninja
  "${PIP[@]}" "$TORCH_PIN" --no-deps "sglang==0.5.23"
  "${PIP[@]}" "$TORCH_PIN" "torchvision==0.29.*" \
    aiohttp "anthropic>=0.20.0" "blobfile==3.0.0" build "compressed-tensors==0.18.0" datasets distro easydict \
    einops fastapi gguf interegular IPython "llguidance>=1.7.6,<2.0.0" "mistral_common>=1.11.5" msgspec ninja \
    "numba==0.65.1" numpy "openai==2.8.0" "openai-harmony==0.0.4" orjson "outlines==0.1.11" packaging \
    partial_json_parser pillow "prometheus-client>=0.20.0" psutil pybase64 pydantic "python-dateutil<3" \
    python-multipart "pyzmq>=25.1.2" regex requests scipy "sentencepiece==0.2.1" setproctitle "soundfile==0.13.1" \
    tiktoken "timm==1.0.25" "tokenizers==0.23.2" tqdm "transformers==5.19.0" "uvicorn>=0.51" uvloop watchfiles \
    "xgrammar==0.2.7" xxhash zstandard httpx
fi

if [ "${TORCHTPU_INSTALL:-0}" = 1 ]; then
  cd "$(dirname "$0")/.."
  "$PYTHON" -m pip uninstall -q -y torchtpu-sglang-dev 2>/dev/null || true
  "${PIP[@]}" "$TORCH_PIN" scikit-build-core ninja xla-cpu-pjrt numpy
  TORCH_DEVICE_BACKEND_AUTOLOAD=0 CCACHE_BASEDIR="$(pwd)" "${PIP[@]}" --no-build-isolation \
    -C build-dir=build/torch2.14.1 "$TORCH_PIN" .
fi

"$PYTHON" - <<'PY'
import importlib.metadata as m, os, sysconfig
eps = m.entry_points()
want = {("sglang.srt.platforms", "torchtpu.sglang:platform"),
        ("sglang.srt.plugins", "torchtpu.sglang:register")}
if all(any(e.value == v for e in eps.select(group=g)) for g, v in want):
    print("install_sglang: entry points sglang.srt.platforms and sglang.srt.plugins torchtpu present")
else:
    d = os.path.join(sysconfig.get_paths()["purelib"], "torchtpu_sglang_dev-0.0.0.dist-info")
    os.makedirs(d, exist_ok=True)
    files = {
        "METADATA": "Metadata-Version: 2.1\nName: torchtpu-sglang-dev\nVersion: 0.0.0\n"
                    "Summary: torchtpu's SGLang entry points, for a torchtpu source tree on PYTHONPATH\n",
        "entry_points.txt": "[sglang.srt.platforms]\ntorchtpu = torchtpu.sglang:platform\n\n"
                            "[sglang.srt.plugins]\ntorchtpu = torchtpu.sglang:register\n",
        "INSTALLER": "tools/install_sglang.sh\n",
    }
    files["RECORD"] = "".join(f"torchtpu_sglang_dev-0.0.0.dist-info/{f},,\n" for f in [*files, "RECORD"])
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    print("install_sglang: wrote", d)
PY
"$PYTHON" -c 'import sglang, torch; print("install_sglang: sglang", sglang.__version__, "torch", torch.__version__)'
