#!/usr/bin/env bash
# The GPU check for a lent NVIDIA machine (no internet there): build the CUDA wheel from a carried
# sdist with our installer, then run bench/gpu.py. Usage: bench/gpu_check.sh SDIST OUT_DIR
set -uo pipefail
sdist=$1; out=$2
mkdir -p "$out"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
python3 -m ggufdesk probe --json > "$out/probe-cli.json" 2>> "$out/nvidia-smi.txt"
t0=$(date +%s)
whl=$(LLAMA_CPP_PYTHON_SDIST=$sdist GGUFDESK_NO_BUILD_ISOLATION=1 GGUFDESK_WHEEL_CACHE=/tmp/wheels \
      GGUFDESK_EXTRA_CMAKE_ARGS="-DLLAVA_BUILD=OFF" CUDA_ARCHS=90 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      timeout 330 installer/llama_wheel.sh python3 2> "$out/build.log")
echo "build: $(( $(date +%s) - t0 )) s, wheel: $whl" | tee "$out/build-time.txt"
[ -n "$whl" ] || { tail -30 "$out/build.log"; exit 1; }
python3 -m pip install -q --no-deps --no-index --target /tmp/llama "$whl" && export PYTHONPATH=/tmp/llama:$PYTHONPATH
python3 bench/gpu.py "$out" 2>&1 | tee "$out/gpu.log"
