#!/usr/bin/env bash
# `make dist`: the self-contained bundle (PyInstaller, one folder: its own Python, PySide6, llama-cpp-python)
# as dist/ggufdesk-<version>-<os>-<arch>[-variant].tar.gz, and on Linux the .deb made from the same folder.
#
# Environment:
#   GGUFDESK_VARIANT  cpu (default; metal on macOS), cuda, vulkan: the llama-cpp-python build, chosen
#                     exactly as installer/llama_wheel.sh chooses it (and cached there)
#   GGUFDESK_STARTER  1 (default): the offline starter model rides along; 0: a lean bundle without it
#   PYTHON            the Python 3.11+ that the bundle is built from (default python3)
# The build venv lives in dist/build/<variant>/venv and is reused, so a second run only re-freezes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
t0=$(date +%s)

case "$(uname -s)" in
  Linux) os=linux; bindir=bin ;;
  Darwin) os=macos; bindir=bin ;;
  MINGW*|MSYS*|CYGWIN*) os=windows; bindir=Scripts ;;
  *) echo "build_bundle: unsupported system $(uname -s)" >&2; exit 2 ;;
esac
arch=$(uname -m)
case "$arch" in amd64) arch=x86_64 ;; aarch64) arch=arm64 ;; esac
default_variant=cpu
[ "$os" = macos ] && default_variant=metal
variant=${GGUFDESK_VARIANT:-$default_variant}
starter=${GGUFDESK_STARTER:-1}
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' app/ggufdesk/__init__.py)
platform="$os-$arch"
name="ggufdesk-$version-$platform"
if [ "$variant" != cpu ] && [ "$variant" != metal ]; then name="$name-$variant"; fi
[ "$starter" = 1 ] || name="$name-nostarter"

build="dist/build/$variant"
venv="$build/venv"
vpy="$venv/$bindir/python"
step() { echo "dist: $* ($(( $(date +%s) - t0 )) s)" >&2; }

[ -x "$vpy" ] || [ -x "$vpy.exe" ] || { step "creating the build venv $venv"; "$PY" -m venv "$venv"; }
whl=$(GGUFDESK_VARIANT=$variant installer/llama_wheel.sh "$vpy")
flags=$(cat "$(dirname "$whl")/FLAGS" 2>/dev/null || echo unknown)
step "installing llama-cpp-python ($variant), PyInstaller and ggufdesk (non-editable) into $venv"
"$vpy" -m pip install -q --disable-pip-version-check "$whl" "pyinstaller>=6.10,<7" "setuptools>=77" wheel
extra=""
[ "$starter" = 1 ] && extra="[starter]"
# The same version number every build: uninstall our own package first so the bundle has this tree's code.
"$vpy" -m pip uninstall -q -y ggufdesk >/dev/null 2>&1 || true
"$vpy" -m pip install -q --disable-pip-version-check --no-build-isolation ".$extra"  # setuptools is here already

step "freezing with PyInstaller"
rm -rf "$build/out"
GGUFDESK_STARTER=$starter GGUFDESK_VERSION=$version "$vpy" -m PyInstaller --noconfirm --log-level WARN \
  --distpath "$build/out" --workpath "$build/work" installer/ggufdesk.spec >&2
out="$build/out/ggufdesk"
info=$(printf '{"version": "%s", "variant": "%s", "platform": "%s", "starter": %s, "llama_cmake_args": "%s"}' \
  "$version" "$variant" "$platform" "$([ "$starter" = 1 ] && echo true || echo false)" "$flags")
echo "$info" > "$out/build.json"
[ -d "$build/out/ggufdesk.app" ] && echo "$info" > "$build/out/ggufdesk.app/Contents/MacOS/build.json"

mkdir -p dist
: > dist/built.txt  # what this run made, for make dist-test
case "$os" in
  linux)
    step "packing dist/$name.tar.gz"
    rm -rf "$build/stage" && mkdir -p "$build/stage" && mv "$out" "$build/stage/$name"
    tar -C "$build/stage" -cf - "$name" | gzip -6 > "dist/$name.tar.gz.part"
    mv "dist/$name.tar.gz.part" "dist/$name.tar.gz"
    echo "dist/$name.tar.gz" >> dist/built.txt
    step "making the .deb"
    installer/build_deb.sh "$build/stage/$name" "$version" "$variant" "$starter" >> dist/built.txt
    ;;
  macos)
    step "making dist/$name.dmg"
    rm -f "dist/$name.dmg"
    hdiutil create -volname ggufdesk -srcfolder "$build/out/ggufdesk.app" -ov -format UDZO "dist/$name.dmg" >&2
    tar -C "$build/out" -czf "dist/$name.tar.gz" ggufdesk
    printf '%s\n' "dist/$name.tar.gz" "dist/$name.dmg" >> dist/built.txt
    ;;
  windows)
    step "packing dist/$name.zip (the Inno Setup installer is made by installer/windows/ggufdesk.iss)"
    (cd "$build/out" && powershell -NoProfile -Command "Compress-Archive -Force -Path ggufdesk -DestinationPath ../../../$name.zip")
    echo "dist/$name.zip" >> dist/built.txt
    ;;
esac
step "done"
ls -l $(cat dist/built.txt) >&2
