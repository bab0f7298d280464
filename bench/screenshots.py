"""Screenshots for the README: the wizard, the chat (light and dark, 800x600, 200 % scale), the settings.

    .venv/bin/python bench/screenshots.py [--only NAME ...] [--stream-chars N]     (make screenshots)

Offscreen Qt, QWidget.grab(). Each variant runs in its own process, because the scale factor
(QT_SCALE_FACTOR) and the theme (GGUFDESK_THEME, what a dark desktop hands Qt) are fixed when the
QApplication starts. The chat streams from the real engine on the starter model (Gemma 3 270M, a
base model: continue-text mode); a tiny synthetic model is used when the starter is missing. The
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
}


def pump(app, seconds: float, until=None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until and until()):
        app.processEvents()
        time.sleep(0.005)


def demo_services():
    from ggufdesk.ui.services import ModelChoice, ModelServices, rough_plan

    class Demo(ModelServices):
        def hub_reachable(self, timeout: float = 3.0) -> bool:
            return True

        def recommendations(self, hw):
            rows = [("Qwen3 8B Q4_K_M", "Qwen/Qwen3-8B-GGUF", 5.03, ("reasoning", "tools")),
                    ("Llama 3.2 3B Instruct Q4_K_M", "bartowski/Llama-3.2-3B-Instruct-GGUF", 2.02, ("tools",)),
                    ("gpt-oss 20B MXFP4", "ggml-org/gpt-oss-20b-GGUF", 12.1, ("reasoning", "tools", "moe")),
                    ("Gemma 3 4B Instruct Q4_K_M", "ggml-org/gemma-3-4b-it-GGUF", 2.49, ("vision",)),
                    ("Qwen3 30B-A3B Q4_K_M", "Qwen/Qwen3-30B-A3B-GGUF", 18.6, ("reasoning", "tools", "moe"))]
            out = [rough_plan(ModelChoice(label=lbl, source="catalog", repo=r, filename="x.gguf",
                                          size_bytes=int(s * GB), capabilities=caps), hw)
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


def shoot_chat(app, name: str, size, tmp: Path, stream_chars: int) -> list[Path]:
    from ggufdesk.core.history import History
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.core.starter import EXAMPLE_PROMPT
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow

    model = starter_or_tiny(tmp)
    history = History(tmp / "history.sqlite3")
    old = history.new_conversation("Reverse a list in Python", mode="chat")
    history.add_message(old.id, "user", "How do I reverse a list in Python?")
    answer = history.add_message(
        old.id, "assistant",
        "Two common ways:\n\n```python\nxs = [1, 2, 3]\nxs.reverse()      # in place\n"
        "ys = xs[::-1]     # a reversed copy\n```\n\nUse **`reversed(xs)`** when you only need "
        "to iterate.")
    history.update_message(answer.id, stats={"finish_reason": "stop", "n_gen": 48,
                                              "decode_tok_s": 41.3, "model": "qwen2.5-7b-q4_k_m.gguf"})
    history.new_conversation("Trip ideas for Lisbon", mode="chat")
    engine = EngineBridge()
    win = MainWindow(engine=engine, history=history, persist_settings=False)
    win.resize(*size)
    win.show()
    loaded = []
    engine.loaded.connect(loaded.append)
    win.load_model(str(model), LoadSettings(n_ctx=2048))
    pump(app, 180, lambda: loaded)
    win.banner.hide()
    win.sampler.sample_now()
    shots = []
    if name == "chat-light":
        win.new_conversation()
        win.session.update_conversation(sampling=SamplingSettings(temperature=0.7, seed=7,
                                                                  max_tokens=300))
        win.send(EXAMPLE_PROMPT)
        pump(app, 120, lambda: win.session.answer is not None
             and len(win.session.answer.content) > stream_chars)
        pump(app, 0.3)
        shots.append(OUT / "chat-streaming.png")
        win.grab().save(str(shots[-1]))
        win.stop()
        pump(app, 10, lambda: not win.session.busy)
    # the earlier conversation with a code block: Markdown, the stop reason and speed line
    win.conv_list.setCurrentIndex(win.conv_model.index(win.conv_model.row_of(old.id)))
    pump(app, 10, lambda: win.conv is not None and win.conv.id == old.id)
    pump(app, 1.0)
    out = OUT / ("chat-markdown.png" if name == "chat-light" else f"{name}.png")
    win.grab().save(str(out))
    shots.append(out)
    win.close()
    engine.shutdown()
    history.close()
    return shots


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
    from PySide6.QtWidgets import QApplication

    from ggufdesk.ui import theme
    from ggufdesk.ui.app import app_icon

    kind, size = VARIANTS[name][3], VARIANTS[name][2]
    tmp = Path(tempfile.mkdtemp(prefix="ggufdesk-shots-"))
    app = QApplication.instance() or QApplication([])
    app.setOrganizationName("ggufdesk-screenshots")
    app.setWindowIcon(app_icon())
    theme.follow_system(app)
    if kind == "wizard":
        shots = shoot_wizard(app, size)
    elif kind == "settings":
        shots = [shoot_settings(app, size)]
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
        tmp = Path(tempfile.mkdtemp(prefix="ggufdesk-shots-env-"))
        env = dict(os.environ, GGUFDESK_THEME=theme_name, QT_SCALE_FACTOR=str(scale))
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
            env[var] = str(tmp / var.lower())  # a fresh profile; the starter cache is shared
        r = subprocess.run([sys.executable, __file__, "--child", name,
                            "--stream-chars", str(args.stream_chars)], env=env, timeout=900)
        failed += r.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    os._exit(rc)
