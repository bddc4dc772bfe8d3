#!/usr/bin/env bash
# The package's PyTorch checks, run once by hand (not in CI): torch's PyPI wheel is CUDA-sized
# (about 5 GiB with its nvidia-* dependencies), so the project venv has no torch and the tests
# that need it (zero-copy on CPU tensors: tests/python/package/test_arrays.py
# test_torch_tensors_zero_copy, test_sync.py's torch state dict) skip there. This script makes a
# throwaway venv with torch from PyPI and runs exactly those tests against the extension the C++
# build wrote to BUILD/python (default build/).
# Usage: tools/python_torch_check.sh [BUILD]   (venv: $TORCH_VENV, default /tmp/concord-torch-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
VENV="${TORCH_VENV:-/tmp/concord-torch-venv}"
[ -d "$BUILD/python/concord" ] || { echo "$BUILD/python/concord: build target concord_python first" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c "import torch, numpy, pytest, ml_dtypes, safetensors" 2>/dev/null ||
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch numpy pytest ml-dtypes safetensors
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__)"
cd tests/python/package
CONCORD_PYTHON_PATH="$PWD/../../../$BUILD/python" CONCORD_CAPI="$PWD/../../../$BUILD/lib/libconcord_capi.so" \
CONCORD_BIN="$PWD/../../../$BUILD/bin/concord" OMP_WAIT_POLICY=passive PYTHONDONTWRITEBYTECODE=1 \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs -k torch test_arrays.py test_sync.py
