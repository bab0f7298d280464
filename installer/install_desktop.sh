#!/bin/sh
# Puts ggufdesk in the desktop menu: the .desktop file and the icons under ~/.local/share.
# Usage: installer/install_desktop.sh [VENV]   (make run passes .venv). Never fails the build.
VENV="${1:-.venv}"
ROOT="$(cd "$(dirname "$0")/.." 2>/dev/null && pwd)" || exit 0
RES="$ROOT/app/ggufdesk/resources"
DATA="${XDG_DATA_HOME:-$HOME/.local/share}"
APPS="$DATA/applications"
ICONS="$DATA/icons/hicolor"

case "$(uname -s 2>/dev/null)" in
  Linux|*BSD) ;;
  *) echo "install_desktop: not a freedesktop system; skipping"; exit 0 ;;
esac

EXE="$(cd "$ROOT" && cd "$(dirname "$VENV/bin/ggufdesk-gui")" 2>/dev/null && pwd)/ggufdesk-gui"
[ -x "$EXE" ] || EXE="ggufdesk-gui"

mkdir -p "$APPS" "$ICONS/scalable/apps" 2>/dev/null || { echo "install_desktop: cannot write $DATA; skipping"; exit 0; }
for f in "$RES"/icons/ggufdesk-*.png; do
  [ -f "$f" ] || continue
  n="$(basename "$f" .png)"; n="${n#ggufdesk-}"
  mkdir -p "$ICONS/${n}x${n}/apps" && cp -f "$f" "$ICONS/${n}x${n}/apps/ggufdesk.png"
done
cp -f "$RES/ggufdesk.svg" "$ICONS/scalable/apps/ggufdesk.svg" 2>/dev/null
# Exec/TryExec point at this checkout's venv so double-click works without PATH changes.
sed -e "s|^Exec=.*|Exec=\"$EXE\"|" -e "s|^TryExec=.*|TryExec=$EXE|" \
    "$RES/ggufdesk.desktop" > "$APPS/ggufdesk.desktop" 2>/dev/null || exit 0
chmod 644 "$APPS/ggufdesk.desktop" 2>/dev/null
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database -q "$APPS" 2>/dev/null
command -v gtk-update-icon-cache >/dev/null 2>&1 && gtk-update-icon-cache -q -t "$ICONS" 2>/dev/null
echo "install_desktop: ggufdesk added to the menu ($APPS/ggufdesk.desktop)"
exit 0
