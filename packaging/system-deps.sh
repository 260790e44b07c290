#!/usr/bin/env bash
# Qt needs a few system libraries; Xvfb, xwd and netpbm are for real windows and screenshots,
# desktop-file-utils validates the .desktop entry. Installs what is missing when run as root on a
# Debian/Ubuntu system; otherwise prints what to install. Never fails the build by itself: the tests
# say clearly what is missing (QT_DEBUG_PLUGINS=1 names it).
set -u
pkgs=(libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3 libglib2.0-0
      xvfb xauth libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0
      x11-apps netpbm desktop-file-utils)
command -v dpkg >/dev/null 2>&1 || exit 0
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing system packages for Qt: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || echo "warning: apt-get could not install: ${missing[*]}" >&2
else
  echo "Qt may need these system packages: sudo apt-get install ${missing[*]}" >&2
fi
exit 0
