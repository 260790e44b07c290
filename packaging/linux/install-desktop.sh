#!/usr/bin/env bash
# Install Loadout into the current user's desktop (no root): menu entry, icons, and the MIME types
# so .safetensors, .sft, .ckpt and .latent files open in Loadout by double-click.
# Usage: packaging/linux/install-desktop.sh [--exec /path/to/loadout] [--uninstall]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
id=io.github.loadout.Loadout
exe=""
uninstall=0
while [ $# -gt 0 ]; do
  case "$1" in
    --exec) exe="$2"; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    *) echo "usage: $0 [--exec PATH] [--uninstall]" >&2; exit 2 ;;
  esac
done

refresh() {
  command -v update-mime-database >/dev/null && update-mime-database "$data/mime" >/dev/null 2>&1 || true
  command -v update-desktop-database >/dev/null && update-desktop-database "$data/applications" >/dev/null 2>&1 || true
  command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$data/icons/hicolor" >/dev/null 2>&1 || true
}

if [ $uninstall = 1 ]; then
  rm -f "$data/applications/$id.desktop" "$data/mime/packages/loadout-mime.xml"
  rm -f "$data"/icons/hicolor/*/apps/loadout.png "$data/icons/hicolor/scalable/apps/loadout.svg"
  refresh
  echo "Loadout removed from your desktop."
  exit 0
fi

# Which executable: the argument, the packaged app, the project's venv, or one on PATH.
if [ -z "$exe" ]; then
  for c in "$root/dist/Loadout/loadout" "$root/.venv/bin/loadout" "$(command -v loadout || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then exe="$c"; break; fi
  done
fi
[ -n "$exe" ] && [ -x "$exe" ] || { echo "no loadout executable found: run 'make run' or 'make package' first, or pass --exec" >&2; exit 1; }

mkdir -p "$data/applications" "$data/mime/packages" "$data/icons/hicolor/scalable/apps"
sed "s|^Exec=loadout|Exec=\"$exe\"|" "$here/$id.desktop" > "$data/applications/$id.desktop"
cp "$here/loadout-mime.xml" "$data/mime/packages/loadout-mime.xml"
cp "$root/resources/loadout.svg" "$data/icons/hicolor/scalable/apps/loadout.svg"
icons="$root/build/icons"
if [ ! -f "$icons/loadout-256.png" ]; then
  py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
  "$py" "$root/packaging/make_icons.py" "$icons" >/dev/null
fi
for png in "$icons"/loadout-*.png; do
  s="$(basename "$png" .png)"; s="${s#loadout-}"
  mkdir -p "$data/icons/hicolor/${s}x${s}/apps"
  cp "$png" "$data/icons/hicolor/${s}x${s}/apps/loadout.png"
done
refresh
if command -v xdg-mime >/dev/null; then
  xdg-mime default "$id.desktop" application/x-safetensors application/x-pytorch-checkpoint application/x-comfyui-latent || true
fi
echo "Loadout installed for $USER: $data/applications/$id.desktop -> $exe"
