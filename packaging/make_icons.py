"""Render resources/loadout.svg into the icon sizes each platform wants (PNG sizes for Linux's hicolor
theme, .ico for Windows, .icns for macOS). Uses QtSvg (in PySide6-Essentials) and Pillow."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(svg: Path, out_dir: Path) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"{svg}: not a valid SVG")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in SIZES:
        img = QImage(s, s, QImage.Format.Format_ARGB32)
        img.fill(Qt.GlobalColor.transparent)
        p = QPainter(img)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(p)
        p.end()
        path = out_dir / f"loadout-{s}.png"
        img.save(str(path))
        paths.append(path)
    return paths


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "icons"
    pngs = render(ROOT / "resources" / "loadout.svg", out)
    from PIL import Image

    big = Image.open(pngs[-1])
    big.save(out / "loadout.ico", sizes=[(s, s) for s in SIZES if s <= 256])
    big.save(out / "loadout.icns")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
