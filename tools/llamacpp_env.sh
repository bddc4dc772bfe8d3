#!/usr/bin/env bash
# Builds llama.cpp (through PyPI's source package llama-cpp-python) once into its own venv,
# tools/.llamacpp-venv, for the reference side of the SmolLM2 comparisons
# (tools/make_llamacpp_golden.py, tools/bench_llamacpp.py). The engine itself never needs it.
#
#   tools/llamacpp_env.sh            # build (minutes on 2 cores); prints the version built
#   LLAMACPP_VERSION=0.3.16 tools/llamacpp_env.sh   # pin a version
#
# GGML_NATIVE=ON builds ggml for this CPU (-march=native: AVX2/AVX-512/VNNI where present), as a
# llama.cpp user compiling on the machine would. The build runs under nice -n 10.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${LLAMACPP_VENV:-$here/.llamacpp-venv}"
py="${PYTHON:-python3}"
spec="llama-cpp-python${LLAMACPP_VERSION:+==$LLAMACPP_VERSION}"

if [[ ! -x "$venv/bin/python" ]]; then
  "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
echo "llamacpp_env: building $spec into $venv (CMAKE_ARGS=$CMAKE_ARGS)" >&2
nice -n 10 "$venv/bin/python" -m pip install --no-binary llama-cpp-python --verbose "$spec" numpy safetensors gguf
"$venv/bin/python" - <<'PY'
import llama_cpp, importlib.metadata as md
print("llama-cpp-python", md.version("llama-cpp-python"))
try:
    print("system_info", llama_cpp.llama_print_system_info().decode())
except Exception as e:
    print("system_info unavailable:", e)
PY
