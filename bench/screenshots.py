"""Screenshots for the README: the wizard, the chat window mid-stream with gauges, the settings dialog.

    .venv/bin/python bench/screenshots.py      (make screenshots)

Offscreen Qt, QWidget.grab(). The chat streams from the real engine on the starter model (Gemma 3
270M, base model, so completion mode); a tiny synthetic model is used when the starter is missing.
The wizard's hardware page shows this machine's real probe; its model list is a demo list planned
for this machine (the hub is not reachable from where screenshots are taken).
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "screenshots"
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
TMP = Path(tempfile.mkdtemp(prefix="ggufdesk-shots-"))
for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
    os.environ[var] = str(TMP / var.lower())

GB = 1024**3


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
            rows = [("Qwen2.5 7B Instruct Q4_K_M", "bartowski/Qwen2.5-7B-Instruct-GGUF", 4.68),
                    ("Llama 3.2 3B Instruct Q4_K_M", "bartowski/Llama-3.2-3B-Instruct-GGUF", 2.02),
                    ("Qwen2.5 1.5B Instruct Q8_0", "Qwen/Qwen2.5-1.5B-Instruct-GGUF", 1.89),
                    ("Gemma 3 1B IT Q4_K_M", "unsloth/gemma-3-1b-it-GGUF", 0.81),
                    ("Qwen2.5 32B Instruct Q4_K_M", "bartowski/Qwen2.5-32B-Instruct-GGUF", 19.9)]
            out = [rough_plan(ModelChoice(label=name, source="catalog", repo=r, filename="x.gguf",
                                          size_bytes=int(s * GB)), hw) for name, r, s in rows]
            out[1].recommended = True
            out[1].draft = ModelChoice(label="Llama 3.2 1B Instruct Q8_0", source="catalog",
                                       repo="bartowski/Llama-3.2-1B-Instruct-GGUF",
                                       filename="d.gguf", size_bytes=int(1.32 * GB))
            return out

        def local_choices(self, hw):
            return super().local_choices(hw)[:1]

    return Demo()


def shoot_wizard(app) -> list[Path]:
    from ggufdesk.ui.wizard import ModelWizard

    wiz = ModelWizard(demo_services())
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


def shoot_chat(app) -> list[Path]:
    from ggufdesk.core.history import History
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow

    try:
        from ggufdesk.core.starter import starter_model_path

        model = starter_model_path()
    except Exception:  # noqa: BLE001 - no starter: the tiny synthetic model still streams
        from tests.fixtures.ggufs import TinySpec, write_tiny_llama

        model = write_tiny_llama(TMP / "tiny.gguf", TinySpec())
    history = History(TMP / "history.sqlite3")
    old = history.new_conversation("Reverse a list in Python", mode="chat")
    history.add_message(old.id, "user", "How do I reverse a list in Python?")
    history.add_message(old.id, "assistant",
                        "Two common ways:\n\n```python\nxs = [1, 2, 3]\nxs.reverse()      # in place\n"
                        "ys = xs[::-1]     # a reversed copy\n```\n\nUse **`reversed(xs)`** when you "
                        "only need to iterate.")
    history.new_conversation("Trip ideas for Lisbon", mode="chat")
    engine = EngineBridge()
    win = MainWindow(engine=engine, history=history, persist_settings=False)
    win.resize(1280, 800)
    win.show()
    loaded = []
    engine.loaded.connect(loaded.append)
    win.load_model(str(model), LoadSettings(n_ctx=2048))
    pump(app, 120, lambda: loaded)
    win.sampler.sample_now()
    win.new_conversation()
    win.session.update_conversation(sampling=SamplingSettings(temperature=0.7, seed=7, max_tokens=400))
    win.send("A short guide to speculative decoding.\n\nSpeculative decoding makes language models")
    pump(app, 60, lambda: win.session.answer is not None and len(win.session.answer.content) > 600)
    pump(app, 0.3)
    p1 = OUT / "chat-streaming.png"
    win.grab().save(str(p1))
    win.stop()
    pump(app, 5, lambda: win.session.answer is None)
    # the earlier conversation with a code block, to show Markdown rendering
    win.conv_list.setCurrentIndex(win.conv_model.index(win.conv_model.row_of(old.id)))
    pump(app, 1.0)
    p2 = OUT / "chat-markdown.png"
    win.grab().save(str(p2))
    win.close()
    engine.shutdown()
    history.close()
    return [p1, p2]


def shoot_settings(app) -> Path:
    from ggufdesk.core.settings import LoadSettings, SpeculationSettings
    from ggufdesk.ui.settings_dialog import SettingsDialog

    dlg = SettingsDialog(LoadSettings(n_ctx=8192), SpeculationSettings(mode="lookup"))
    dlg.show()
    dlg.w["n_ubatch"].setValue(1024)  # larger than n_batch: shows how a bad value is refused
    pump(app, 0.3)
    p = OUT / "settings.png"
    dlg.grab().save(str(p))
    dlg.close()
    return p


def main() -> int:
    from PySide6.QtWidgets import QApplication

    from ggufdesk.ui.app import app_icon

    OUT.mkdir(parents=True, exist_ok=True)
    app = QApplication.instance() or QApplication([])
    app.setWindowIcon(app_icon())
    shots = shoot_wizard(app) + shoot_chat(app) + [shoot_settings(app)]
    for s in shots:
        print(s.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    os._exit(rc)
