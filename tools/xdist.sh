# Sourced by the test scripts: xdist_args PYTHON sets XDIST to 2 pytest-xdist workers, a test
# file per worker (TORCHTPU_TEST_WORKERS=N; 0 runs tests in one process), installing pytest-xdist
# (at the venv's torch) into a venv made before the workers were added.
xdist_args() {
  local py=$1 n=${TORCHTPU_TEST_WORKERS:-2}
  XDIST=()
  [ "$n" = "0" ] && return 0
  "$py" -c 'import xdist' 2>/dev/null \
    || "$py" -m pip install -q --disable-pip-version-check \
         "$("$py" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])')" pytest-xdist
  XDIST=(-n "$n" --dist loadfile)
}
