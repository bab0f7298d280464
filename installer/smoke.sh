#!/usr/bin/env bash
# Smoke test of what `make dist` built, run in a clean environment: no venv, no PYTHONPATH, a temp HOME,
# PATH=/usr/bin:/bin (`env -i`). Used by `make dist-test`, .ci/run and .github/workflows/release.yml.
#   installer/smoke.sh dist/ggufdesk-<version>-<platform>.tar.gz|.zip   extract; --version, probe --json,
#                                                   library --json (both starters), run <tiny model> --json,
#                                                   the GUI offscreen for 8 s
#   installer/smoke.sh dist/ggufdesk_<version>_amd64.deb    dpkg -i; menu entry, icons, /usr/bin/ggufdesk
#                                                   probe; user data survives dpkg -r (always removed, trap)
# SMOKE_MODEL: a tiny GGUF for the run step (make dist-test writes one with tests/fixtures/ggufs.py).
set -euo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 ARCHIVE_OR_DEB" >&2; exit 2; }
target=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
model=${SMOKE_MODEL:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ggufdesk-smoke.XXXXXX")
home="$tmp/home"
mkdir -p "$home" "$tmp/t"
installed=""
gui_pid=""

cleanup() {
  rc=$?
  if [ -n "$gui_pid" ]; then stop KILL "$gui_pid"; fi
  if [ -n "$installed" ]; then dpkg -r "$installed" >/dev/null 2>&1 || echo "smoke: dpkg -r $installed FAILED" >&2; fi
  rm -rf "$tmp"
  [ $rc -eq 0 ] && echo "smoke: all checks passed ($(basename "$target"))" || echo "smoke: FAILED ($(basename "$target"))" >&2
  exit $rc
}
trap cleanup EXIT

fail() { echo "smoke: FAIL: $*" >&2; exit 1; }
ok() { echo "smoke: ok: $*"; }
# The app sees only these variables; the harness (this script) may use the machine's python3 to read JSON.
keep=()  # Windows programs need these two to start at all
case "$(uname -s)" in MINGW*|MSYS*|CYGWIN*) keep=("SYSTEMROOT=${SYSTEMROOT:-}" "WINDIR=${WINDIR:-}") ;; esac
clean() { env -i HOME="$home" PATH=/usr/bin:/bin TMPDIR="$tmp/t" ${keep[@]+"${keep[@]}"} "$@"; }
stop() {  # stop PID: its process group (setsid) where there is one, else the process
  kill -"$1" -- "-$2" 2>/dev/null || kill -"$1" "$2" 2>/dev/null || true
}
json_has() {  # json_has FILE KEY...: every KEY is in the JSON object in FILE
  local f=$1; shift
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); m=[k for k in sys.argv[2:] if k not in d]; sys.exit(f"missing {m}" if m else 0)' "$f" "$@"
  else
    for k in "$@"; do grep -q "\"$k\"" "$f" || { echo "missing $k"; return 1; }; done
  fi
}

check_cli() {  # check_cli EXE: --version, probe --json, run --json
  local exe=$1
  clean "$exe" --version > "$tmp/version" 2>&1 || fail "--version: $(cat "$tmp/version")"
  grep -Eq '^ggufdesk [0-9]+\.[0-9]+' "$tmp/version" || fail "--version printed: $(cat "$tmp/version")"
  ok "$(cat "$tmp/version")"
  clean "$exe" probe --json > "$tmp/probe.json" 2> "$tmp/probe.err" || fail "probe --json: $(tail -5 "$tmp/probe.err")"
  json_has "$tmp/probe.json" gpus cpu ram_total ram_bandwidth_gbs || fail "probe --json: $(head -c 400 "$tmp/probe.json")"
  ok "probe --json"
}

check_run() {  # check_run EXE: one generation through the bundle's engine process
  local exe=$1
  if [ -z "$model" ]; then echo "smoke: SMOKE_MODEL not set; the run step is skipped" >&2; return; fi
  clean "$exe" run "$model" --prompt "Hello" --max-tokens 8 --temperature 0 --seed 1 --ctx 256 --json \
    > "$tmp/run.json" 2> "$tmp/run.err" || fail "run --json: $(tail -5 "$tmp/run.err")"
  json_has "$tmp/run.json" text tokens decode_tok_s finish_reason || fail "run --json: $(head -c 400 "$tmp/run.json")"
  ok "run $(basename "$model") --json"
}

check_library() {  # check_library EXE: both offline starters are listed by id (unless a -nostarter build)
  local exe=$1
  clean "$exe" library --json > "$tmp/library.json" 2> "$tmp/library.err" || fail "library --json: $(tail -5 "$tmp/library.err")"
  case "$(basename "$target")" in *nostarter*) ok "library --json (no starters in this build)"; return ;; esac
  for id in smollm2-135m-instruct gemma-3-270m; do
    grep -q "\"id\": \"$id\"" "$tmp/library.json" || fail "library --json does not list the starter $id: $(head -c 600 "$tmp/library.json")"
  done
  ok "library --json lists both starters"
}

check_gui() {  # check_gui EXE: the window comes up offscreen and is still running after 8 s
  local exe=$1
  local group=()
  command -v setsid >/dev/null 2>&1 && group=(setsid)  # the GUI and its engine process in one group
  ${group[@]+"${group[@]}"} env -i HOME="$home" PATH=/usr/bin:/bin TMPDIR="$tmp/t" QT_QPA_PLATFORM=offscreen \
    GGUFDESK_NO_GPU_HINT=1 "$exe" > "$tmp/gui.log" 2>&1 &
  gui_pid=$!
  for _ in $(seq 16); do
    sleep 0.5
    kill -0 "$gui_pid" 2>/dev/null || { wait "$gui_pid" || true; gui_pid=""; fail "GUI exited within 8 s: $(tail -20 "$tmp/gui.log")"; }
  done
  stop TERM "$gui_pid"
  wait "$gui_pid" 2>/dev/null || true
  gui_pid=""
  if grep -q "Traceback" "$tmp/gui.log"; then fail "GUI printed a traceback: $(grep -A20 Traceback "$tmp/gui.log" | head -40)"; fi
  ok "GUI ran offscreen for 8 s"
}

case "$target" in
  *.tar.gz|*.zip)
    mkdir -p "$tmp/x"
    case "$target" in
      *.zip) (cd "$tmp/x" && unzip -q "$target") ;;
      *) tar -C "$tmp/x" -xzf "$target" ;;
    esac
    dir=$(find "$tmp/x" -mindepth 1 -maxdepth 1 -type d | head -n 1)
    exe="$dir/ggufdesk"
    [ -x "$exe" ] || exe="$dir/ggufdesk.exe"
    [ -x "$exe" ] || fail "no ggufdesk executable in $(basename "$target")"
    check_cli "$exe"
    check_library "$exe"
    check_run "$exe"
    gui="$dir/ggufdesk-gui"
    [ -x "$gui" ] || gui=$exe
    case "$(uname -s)" in Linux|Darwin) check_gui "$gui" ;; esac
    ;;
  *.deb)
    [ "$(id -u)" = 0 ] || fail "installing a .deb needs root (run as root, or in a container)"
    pkg=$(dpkg-deb -f "$target" Package)
    if dpkg -s "$pkg" >/dev/null 2>&1; then fail "$pkg is already installed here; not touching it"; fi
    dpkg -i "$target" >/dev/null || fail "dpkg -i"
    installed=$pkg
    ok "dpkg -i $(basename "$target")"
    desktop=/usr/share/applications/ggufdesk.desktop
    [ -f "$desktop" ] || fail "no menu entry $desktop"
    grep -q '^Exec=ggufdesk-gui' "$desktop" || fail "menu entry does not start ggufdesk-gui"
    if command -v desktop-file-validate >/dev/null 2>&1; then desktop-file-validate "$desktop" || fail "desktop-file-validate"; fi
    [ -f /usr/share/icons/hicolor/48x48/apps/ggufdesk.png ] || fail "no hicolor icon"
    [ -x /usr/bin/ggufdesk-gui ] || fail "no /usr/bin/ggufdesk-gui"
    ok "menu entry, icons and /usr/bin/ggufdesk-gui"
    check_cli /usr/bin/ggufdesk
    mkdir -p "$home/.local/share/ggufdesk" && echo keep > "$home/.local/share/ggufdesk/user-data"
    dpkg -r "$pkg" >/dev/null || fail "dpkg -r"
    installed=""
    [ ! -e /opt/ggufdesk ] && [ ! -e /usr/bin/ggufdesk ] && [ ! -e "$desktop" ] || fail "dpkg -r left files behind"
    [ -f "$home/.local/share/ggufdesk/user-data" ] || fail "dpkg -r removed user data"
    ok "dpkg -r removed the app and kept user data"
    ;;
  *) fail "not a .tar.gz, .zip or .deb: $target" ;;
esac
