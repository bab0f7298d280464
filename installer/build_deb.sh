#!/usr/bin/env bash
# The .deb, made with dpkg-deb from the bundle folder: /opt/ggufdesk, /usr/bin/ggufdesk and ggufdesk-gui,
# the menu entry and hicolor icons. It owns only those paths, so removing it leaves every user's
# history, models and settings (under ~/.local/share, ~/.config, ~/.cache) where they are.
# Usage: installer/build_deb.sh BUNDLE_DIR VERSION [VARIANT] [STARTER]   → dist/<package>_<version>_amd64.deb
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=$1 version=$2 variant=${3:-cpu} starter=${4:-1}
pkg=ggufdesk
[ "$variant" = cpu ] || pkg="ggufdesk-$variant"
res=app/ggufdesk/resources
deb="dist/${pkg}_${version}_amd64.deb"
[ "$starter" = 1 ] || deb="dist/${pkg}_${version}_amd64-nostarter.deb"  # the same package, without the starter

root=$(mktemp -d "${TMPDIR:-/tmp}/ggufdesk-deb.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/DEBIAN" "$root/opt" "$root/usr/bin" "$root/usr/share/applications" \
  "$root/usr/share/icons/hicolor/scalable/apps"
cp -al "$bundle" "$root/opt/ggufdesk" 2>/dev/null || cp -a "$bundle" "$root/opt/ggufdesk"
chmod -R u+rwX,go+rX,go-w "$root/opt/ggufdesk"
ln -s /opt/ggufdesk/ggufdesk "$root/usr/bin/ggufdesk"
ln -s /opt/ggufdesk/ggufdesk-gui "$root/usr/bin/ggufdesk-gui"
install -m 644 "$res/ggufdesk.desktop" "$root/usr/share/applications/ggufdesk.desktop"
install -m 644 "$res/ggufdesk.svg" "$root/usr/share/icons/hicolor/scalable/apps/ggufdesk.svg"
for f in "$res"/icons/ggufdesk-*.png; do
  n=$(basename "$f" .png); n=${n#ggufdesk-}
  install -D -m 644 "$f" "$root/usr/share/icons/hicolor/${n}x${n}/apps/ggufdesk.png"
done

size=$(du -sk "$root" | cut -f1)
# The bundle runs on the C library it was built against or newer: depend on the newest symbol it uses.
glibc=2.31
if command -v objdump >/dev/null 2>&1; then
  glibc=$(find "$root/opt/ggufdesk" -type f \( -name '*.so*' -o -perm -u+x \) -exec objdump -T {} + 2>/dev/null \
    | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n 1) || true
  glibc=${glibc:-2.31}
fi
# One variant at a time: ggufdesk (CPU), ggufdesk-cuda and ggufdesk-vulkan all own /opt/ggufdesk.
if [ "$pkg" = ggufdesk ]; then others="ggufdesk-cuda, ggufdesk-vulkan"; provides=""
else others="ggufdesk"; provides="Provides: ggufdesk"$'\n'; fi
cat > "$root/DEBIAN/control" <<EOF
Package: $pkg
Version: $version
Architecture: amd64
Maintainer: ggufdesk developers <ggufdesk@users.noreply.github.com>
Installed-Size: $size
Section: utils
Priority: optional
Depends: libc6 (>= $glibc)
Recommends: libegl1, libgl1, libfontconfig1, libxkbcommon-x11-0, libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1, libxcb-shape0
${provides}Conflicts: $others
Replaces: $others
Homepage: https://github.com/ggufdesk/ggufdesk
Description: Run large language models locally, fast
 A desktop app and command line for GGUF language models: quant planner,
 speculative decoding, streaming chat. Self-contained: its own Python, Qt and
 llama.cpp ($variant build$([ "$starter" = 1 ] && echo ", with the offline starter model")) under /opt/ggufdesk.
EOF
# The menu and icon caches are refreshed by the desktop-file-utils and hicolor-icon-theme triggers.
dpkg-deb --root-owner-group -Zgzip -z6 --build "$root" "$deb.part" >/dev/null
mv "$deb.part" "$deb"
echo "$deb"
