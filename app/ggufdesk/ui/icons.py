"""Renders ggufdesk/resources/ggufdesk.svg into the PNG icon sizes (`python -m ggufdesk.ui.icons`)."""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render_pngs(svg: Path, outdir: Path, sizes: tuple[int, ...] = SIZES) -> list[Path]:
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    outdir.mkdir(parents=True, exist_ok=True)
    out = []
    for n in sizes:
        img = QImage(n, n, QImage.Format.Format_ARGB32)
        img.fill(Qt.GlobalColor.transparent)
        qp = QPainter(img)
        qp.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(qp)
        qp.end()
        path = outdir / f"ggufdesk-{n}.png"
        img.save(str(path))
        out.append(path)
    return out


if __name__ == "__main__":
    from ggufdesk.ui.app import resources_dir

    app = QGuiApplication.instance() or QGuiApplication(sys.argv)
    res = resources_dir()
    for p in render_pngs(res / "ggufdesk.svg", res / "icons"):
        print(p)
