"""Screenshots of chatting with documents: a 40 MB PDF indexing (progress bar, count, ETA), an answer with
its sources, and a cited passage opened at its PDF page. Run under a real X server:

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python bench/docs_screenshot.py [--mb 40]

Writes docs/screenshots/docs-indexing.png, docs-answer.png and docs-passage.png. The chat model is the
chat starter (or the tiny synthetic model); the PDF is generated (fpdf2, uncompressed to reach the size).
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "app"))
OUT = ROOT / "docs" / "screenshots"


def pump(app, seconds: float, until=None) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        if until is not None and until():
            return True
        time.sleep(0.01)
    return False


def big_pdf(path: Path, mb: int) -> Path:
    """An uncompressed PDF of prose, about `mb` megabytes, with one known fact on page 1234."""
    import random

    from fpdf import FPDF

    from tests.fixtures import corpus

    def write(pages: int) -> bytes:
        import textwrap

        rng = random.Random(40)
        paras = corpus.prose()
        pdf = FPDF()
        pdf.set_compression(False)
        pdf.set_auto_page_break(False)
        pdf.set_font("Helvetica", size=9)
        for n in range(1, pages + 1):
            pdf.add_page()
            text = " ".join(rng.choice(paras) for _ in range(4))
            if n == 1234:
                text = ("The Harrowgate flood barrier closes automatically when the river gauge at Kings Lane "
                        "reads 4.2 metres. " + text)
            for line in textwrap.wrap(corpus.latin(text), 105)[:62]:  # cell() is much faster than multi_cell()
                pdf.cell(0, 4.2, line, new_x="LMARGIN", new_y="NEXT")
        return bytes(pdf.output())

    per_page = len(write(50)) / 50
    path.write_bytes(write(max(1300, int(mb * 1_000_000 / per_page))))
    return path


def chat_model(tmp: Path) -> Path:
    """The chat starter (SmolLM2 135M Instruct), else the tiny synthetic model."""
    try:
        from ggufdesk.core.starter import default_model_path

        return Path(default_model_path())
    except Exception:  # noqa: BLE001 - no starter installed: the tiny model still answers
        from tests.fixtures.ggufs import TinySpec, write_tiny_llama

        return write_tiny_llama(tmp / "tiny.gguf", TinySpec())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=40)
    args = p.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="ggufdesk-docs-shot-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the generated PDF (40 MB) and the profile
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        os.environ[var] = str(tmp / var.lower())
    pdf = big_pdf(tmp / "river-authority-annual-report.pdf", args.mb)
    print(f"{pdf.name}: {pdf.stat().st_size / 1e6:.1f} MB")

    from PySide6.QtWidgets import QApplication

    from ggufdesk.core.history import History
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow
    from ggufdesk.ui.passage_dialog import PassageDialog

    app = QApplication(sys.argv)
    history = History(tmp / "history.sqlite3")
    engine = EngineBridge()
    win = MainWindow(engine=engine, history=history, persist_settings=False)
    win.resize(1280, 800)
    win.show()
    loaded: list = []
    engine.loaded.connect(loaded.append)
    win.load_model(str(chat_model(tmp)), LoadSettings(n_ctx=4096))
    pump(app, 180, lambda: loaded)
    win.banner.hide()
    win.new_conversation()
    win.session.update_conversation(sampling=SamplingSettings(temperature=0.2, seed=7, max_tokens=120))
    done: list = []
    win.docs.indexing_done.connect(done.append)
    win.docs.attach_paths([pdf])
    bar = win.docs.chip.bar
    pump(app, 600, lambda: bar.isVisible() and bar.maximum() == 1000 and bar.value() >= 350 and "left" in bar.format())
    pump(app, 0.2)
    shots = [OUT / "docs-indexing.png"]
    win.grab().save(str(shots[-1]))
    print("indexing:", bar.format(), "|", bar.toolTip())
    pump(app, 1800, lambda: done)
    print("indexed:", win.docs.chip.label.text())
    win.banner.hide()
    win.send("At what river level does the flood barrier close?")
    pump(app, 300, lambda: not win.session.busy)
    pump(app, 0.5)
    shots.append(OUT / "docs-answer.png")
    win.grab().save(str(shots[-1]))
    answer = win.chat.widget_for(win.session.turns[-1].key)
    cites = answer.citations()
    print("cited:", [(Path(c["source"]).name, c["page"], c["lines"]) for c in cites])
    if cites:
        dialog = PassageDialog(cites[0], win)
        dialog.show()
        pump(app, 1.0)
        shots.append(OUT / "docs-passage.png")
        dialog.grab().save(str(shots[-1]))
        dialog.close()
    win.close()
    engine.shutdown()
    history.close()
    for s in shots:
        print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
