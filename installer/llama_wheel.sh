#!/usr/bin/env bash
# Build (once) and print the path of a llama-cpp-python wheel for this machine.
#
# The wheel is cached outside the clone, keyed by version + build flags + Python tag,
# because pip's own wheel cache does not key on CMAKE_ARGS and the build takes ~7 min.
# Flags: portable CPU by default (GGML_NATIVE=ON dies with SIGILL on AMX CPUs, see
# docs/development.md); CUDA when an NVIDIA GPU and nvcc are present; Metal on macOS.
# Choose with GGUFDESK_VARIANT=cpu|cuda|metal|vulkan; override with GGUFDESK_CMAKE_ARGS; add flags with GGUFDESK_EXTRA_CMAKE_ARGS.
# Offline machines: LLAMA_CPP_PYTHON_SDIST=path/to/sdist.tar.gz and GGUFDESK_NO_BUILD_ISOLATION=1
# (then scikit-build-core must already be installed).
set -euo pipefail

PY=${1:-python3}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${GGUFDESK_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggufdesk/wheels}

# GGML_RPC=ON: the ggml-rpc backend, so `ggufdesk worker` / `--rpc` can spread a model over machines.
rpc_flags="-DGGML_RPC=ON"
cpu_flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON $rpc_flags"
# GGUFDESK_VARIANT picks the build: auto (default: what this machine can use), cpu, cuda, metal, vulkan.
variant=${GGUFDESK_VARIANT:-auto}
if [ "$variant" = auto ]; then
  if [ "$(uname -s)" = Darwin ]; then
    variant=metal
  elif command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    variant=cuda
  else
    variant=cpu
  fi
fi
case "$variant" in
  cpu) flags=$cpu_flags ;;
  # A released CUDA build names its architectures (CUDA_ARCHS="75;80;86;89;90"); native suits this machine only.
  cuda) flags="$cpu_flags -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-native}" ;;
  metal) flags="-DGGML_METAL=on $rpc_flags" ;;
  vulkan) flags="$cpu_flags -DGGML_VULKAN=on" ;;
  *) echo "llama_wheel: unknown GGUFDESK_VARIANT '$variant' (auto, cpu, cuda, metal, vulkan)" >&2; exit 2 ;;
esac
[ -n "${GGUFDESK_CMAKE_ARGS:-}" ] && flags=$GGUFDESK_CMAKE_ARGS
flags="$flags${GGUFDESK_EXTRA_CMAKE_ARGS:+ $GGUFDESK_EXTRA_CMAKE_ARGS}"
src="llama-cpp-python==$VERSION"
[ -n "${LLAMA_CPP_PYTHON_SDIST:-}" ] && src=$LLAMA_CPP_PYTHON_SDIST
isolation=()
[ "${GGUFDESK_NO_BUILD_ISOLATION:-0}" = 1 ] && isolation=(--no-build-isolation)

pytag=$("$PY" -c 'import sys, sysconfig; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{sysconfig.get_platform()}")')
key=$(printf '%s|%s|%s' "$VERSION" "$flags" "$pytag" | sha256sum | cut -c1-16)
dir="$CACHE/llama_cpp_python-$VERSION-$key"

cached() { ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; }
mkdir -p "$(dirname "$CACHE")"
# One build at a time per cache: a second caller (another clone, a parallel make) waits for the first,
# and says so (a build takes minutes). A wheel already cached needs no lock: moved in atomically.
if ! cached && command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE.lock"
  if ! flock -n 9; then
    echo "waiting for another build of llama-cpp-python (cached in $dir; lock $CACHE.lock)…" >&2
    flock 9
    echo "the other build finished; going on" >&2
  fi
fi
if ! cached; then
  echo "building llama-cpp-python $VERSION (flags: $flags); cached in $dir" >&2
  tmp=$(mktemp -d "$CACHE.build.XXXXXX" 2>/dev/null || { mkdir -p "$CACHE"; mktemp -d "$CACHE.build.XXXXXX"; })
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)} \
    "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python ${isolation[@]+"${isolation[@]}"} \
    "$src" -w "$tmp" >&2
  mkdir -p "$CACHE"
  printf '%s\n' "$flags" > "$tmp/FLAGS"
  rm -rf "$dir"
  mv "$tmp" "$dir"   # atomic: a half-built wheel never looks cached
fi
ls "$dir"/llama_cpp_python-*.whl | head -n 1
