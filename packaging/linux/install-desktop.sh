#!/usr/bin/env bash
# Install Loadout into the current user's desktop (no root): menu entry, icons, and the MIME types
# so .safetensors, .sft, .ckpt and .latent files open in Loadout by double-click.
# Usage: packaging/linux/install-desktop.sh [--exec /path/to/loadout] [--uninstall]
# Writes only below $XDG_DATA_HOME (default ~/.local/share); `xdg-mime default` (when present) records the
# default application in $XDG_CONFIG_HOME/mimeapps.list, which --uninstall cleans again.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
config="${XDG_CONFIG_HOME:-$HOME/.config}"
id=io.github.loadout.Loadout
types="application/x-safetensors application/x-pytorch-checkpoint application/x-comfyui-latent"
exe=""
uninstall=0
while [ $# -gt 0 ]; do
  case "$1" in
    --exec) [ $# -ge 2 ] || { echo "--exec needs a path" >&2; exit 2; }; exe="$2"; shift 2 ;;
    --uninstall) uninstall=1; shift ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--exec PATH] [--uninstall]" >&2; exit 2 ;;
  esac
done

refresh() {
  if command -v update-mime-database >/dev/null; then update-mime-database "$data/mime" >/dev/null 2>&1 || true; fi
  if command -v update-desktop-database >/dev/null; then update-desktop-database "$data/applications" >/dev/null 2>&1 || true; fi
  if command -v gtk-update-icon-cache >/dev/null; then gtk-update-icon-cache -q -t "$data/icons/hicolor" >/dev/null 2>&1 || true; fi
}

if [ $uninstall = 1 ]; then
  rm -f "$data/applications/$id.desktop" "$data/mime/packages/loadout-mime.xml"
  rm -f "$data"/icons/hicolor/*/apps/loadout.png "$data/icons/hicolor/scalable/apps/loadout.svg"
  # Our default-application lines (xdg-mime wrote them at install); other applications' lines stay.
  if [ -f "$config/mimeapps.list" ]; then
    sed -i "/=$id\.desktop;\?\$/d" "$config/mimeapps.list"
  fi
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
exe="$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")"  # absolute: the menu starts it from anywhere

mkdir -p "$data/applications" "$data/mime/packages" "$data/icons/hicolor/scalable/apps"
# Exec quoted (the Desktop Entry spec allows a quoted program path, e.g. one with spaces).
sed "s|^Exec=loadout|Exec=\"$exe\"|" "$here/$id.desktop" > "$data/applications/$id.desktop"
cp "$here/loadout-mime.xml" "$data/mime/packages/loadout-mime.xml"
cp "$root/resources/loadout.svg" "$data/icons/hicolor/scalable/apps/loadout.svg"
# PNG sizes: the ones rendered into resources/ (packaging/make_icons.py makes more, e.g. 512, in build/icons).
for png in "$root"/resources/loadout-*.png "$root"/build/icons/loadout-*.png; do
  [ -f "$png" ] || continue
  s="$(basename "$png" .png)"; s="${s#loadout-}"
  mkdir -p "$data/icons/hicolor/${s}x${s}/apps"
  cp "$png" "$data/icons/hicolor/${s}x${s}/apps/loadout.png"
done
refresh
if command -v xdg-mime >/dev/null; then
  # shellcheck disable=SC2086
  XDG_CONFIG_HOME="$config" xdg-mime default "$id.desktop" $types || true
fi
echo "Loadout installed for ${USER:-you}: $data/applications/$id.desktop -> $exe"
