#!/usr/bin/env bash
# Install vLLM 0.33.0 (source build, VLLM_TARGET_DEVICE=empty: no CUDA, no C extension) next to torch 2.13.0,
# for torchtpu's vLLM platform plugin (torchtpu/vllm, docs/vllm.md).
#
#   python3 -m venv /path/to/venv
#   PYTHON=/path/to/venv/bin/python bash tools/install_vllm.sh
#
# Use a virtual environment of its own: vLLM 0.33 pins transformers<5.21, older than the test extra's 5.23.
# Idempotent: skips the build when `vllm` 0.33.x is already installed for $PYTHON.
# Why each flag (see docs/vllm.md):
#  - `pip install vllm==0.33.0` takes the CUDA wheel, which pins torch 2.14.0 -> install the sdist file instead;
#  - the empty build names itself 0.33.0+empty, which pip rejects when fetching/installing by name
#    -> VLLM_VERSION_OVERRIDE for the download, and install the downloaded file;
#  - its [build-system] requires torch 2.14.0 -> --no-build-isolation with the build deps installed first.
# Last step: when torchtpu is not pip-installed for $PYTHON (a source tree on PYTHONPATH), a tiny
# distribution "torchtpu-vllm-dev" declares torchtpu's vLLM entry point (see dev_entry_point).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
VLLM_VERSION=0.33.0
TORCH_PIN="torch==2.13.0"
PIP=("$PYTHON" -m pip)

dev_entry_point() {
  # vLLM finds platforms and general plugins only through entry points of installed
  # distributions (vllm/plugins/__init__.py, load_plugins_by_group). An installed torchtpu
  # declares both (pyproject.toml); for a source tree on PYTHONPATH, write a distribution
  # declaring the same (remove: pip uninstall torchtpu-vllm-dev).
  "$PYTHON" - <<'PY'
import importlib.metadata as m, os, sysconfig
eps = m.entry_points()
want = {("vllm.platform_plugins", "torchtpu.vllm:register"),
        ("vllm.general_plugins", "torchtpu.vllm:register_extensions")}
if all(any(e.value == v for e in eps.select(group=g)) for g, v in want):
    print("install_vllm: entry points vllm.platform_plugins and vllm.general_plugins torchtpu present")
else:
    d = os.path.join(sysconfig.get_paths()["purelib"], "torchtpu_vllm_dev-0.0.0.dist-info")
    os.makedirs(d, exist_ok=True)
    files = {
        "METADATA": "Metadata-Version: 2.1\nName: torchtpu-vllm-dev\nVersion: 0.0.0\n"
                    "Summary: torchtpu's vLLM platform entry point, for a torchtpu source tree on PYTHONPATH\n",
        "entry_points.txt": "[vllm.platform_plugins]\ntorchtpu = torchtpu.vllm:register\n\n"
                            "[vllm.general_plugins]\ntorchtpu = torchtpu.vllm:register_extensions\n",
        "INSTALLER": "tools/install_vllm.sh\n",
    }
    files["RECORD"] = "".join(f"torchtpu_vllm_dev-0.0.0.dist-info/{f},,\n" for f in [*files, "RECORD"])
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    print("install_vllm: wrote", d)
PY
}

numba_for_ngram() {
  # vLLM's n-gram speculative proposer (v1/spec_decode/ngram_proposer.py) is numba code on the
  # host; numba is not among vLLM's requirements
  "$PYTHON" -c 'import numba' 2>/dev/null || "${PIP[@]}" install -q "$TORCH_PIN" "numba==0.68.1"
}

if "$PYTHON" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("vllm").startswith("0.33.") else 1)' \
    2>/dev/null; then
  echo "install_vllm: vllm $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm"))') already installed for $PYTHON"
  numba_for_ngram
  dev_entry_point
  exit 0
fi

"${PIP[@]}" install -q "$TORCH_PIN" xla-cpu-pjrt numpy pytest pytest-xdist
"${PIP[@]}" install -q "$TORCH_PIN" "setuptools>=77.0.3,<81" "setuptools-scm>=8" setuptools-rust wheel \
    "packaging>=24.2" jinja2 cmake ninja

DL="${VLLM_SDIST_DIR:-${TMPDIR:-/tmp}/vllm-sdist}"
mkdir -p "$DL"
SDIST="$DL/vllm-$VLLM_VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  # --no-binary :all: --no-deps: the source distribution only; building its metadata (no compile)
  # needs VLLM_VERSION_OVERRIDE, else the "+empty" local version is rejected against ==0.33.0.
  VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=$VLLM_VERSION "${PIP[@]}" download -q --no-deps \
      --no-binary :all: --no-build-isolation -d "$DL" "vllm==$VLLM_VERSION"
fi
if [ ! -f "$SDIST" ]; then
  echo "install_vllm: could not download $SDIST" >&2
  exit 1
fi
VLLM_TARGET_DEVICE=empty MAX_JOBS="${MAX_JOBS:-1}" "${PIP[@]}" install --no-build-isolation "$TORCH_PIN" "$SDIST"
"$PYTHON" -c 'import vllm, torch; print("install_vllm: vllm", vllm.__version__, "torch", torch.__version__)'
numba_for_ngram
dev_entry_point
