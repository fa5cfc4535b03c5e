#!/usr/bin/env bash
# Create a virtual environment and install assistd with its extras.
#
#   ./install.sh            # .venv with assistd[default]: llama.cpp + the embedded model
#   ./install.sh dev        # the same plus the torch backend and the test dependencies
#   ./install.sh torch      # assistd[default,torch]: both backends, no test tools
#
# llama-cpp-python is compiled from source (about 5-10 minutes on 2 cores). On
# x86-64 we build for x86-64-v3 (AVX2, FMA, F16C) instead of -march=native: on
# virtual machines that advertise AMX without enabling it, a native build dies
# with SIGILL (seen on this project's CI machines). Set CMAKE_ARGS yourself to
# override, e.g. CMAKE_ARGS="-DGGML_CUDA=on" for an NVIDIA GPU build.
set -euo pipefail
cd "$(dirname "$0")"
venv="${ASSISTD_VENV:-.venv}"
extras="default"
case "${1:-}" in
    dev) extras="default,dev" ;;
    torch) extras="default,torch" ;;
    "") ;;
    *) echo "usage: $0 [dev|torch]" >&2; exit 2 ;;
esac

python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = x86_64 ]; then
    export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
fi
if [ "$extras" != default ] && [ -z "${ASSISTD_TORCH_SPEC:-}" ]; then
    # An unpinned torch pulls a multi-GB CUDA build; 2.13.0 resolves to a CPU build on
    # this project's machines. Set ASSISTD_TORCH_SPEC (e.g. "torch") to choose yours.
    ASSISTD_TORCH_SPEC="torch==2.13.0"
fi
if [ -n "${ASSISTD_TORCH_SPEC:-}" ]; then
    "$venv/bin/python" -m pip install -q "$ASSISTD_TORCH_SPEC"
fi
"$venv/bin/python" -m pip install -q -e ".[$extras]"
echo "installed assistd[$extras] into $venv" >&2
