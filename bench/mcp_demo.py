"""MCP acceptance run in the window: an "add" MCP server in mcp.json, "what is 2+3 — use the tool",
the call card, Allow once, and the answer with the tool's result; screenshots of both moments.

    .venv/bin/python bench/mcp_demo.py [--model PATH] [--out DIR]

Offscreen Qt, QWidget.grab(), in an isolated config folder (your own mcp.json is not touched). By
default the engine is the fake one playing a scripted tool-calling model (tests/fixtures/
fake_engine.py with FAKE_ENGINE_CALL): the 135M chat starter does not call tools (asked this, it
answers in prose), so a real model needs --model with a chat model that does (Qwen 2.5 and later,
Llama 3.1+, Mistral). Prints what happened; exits 1 when the answer lacks the tool's result.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
PROMPT = "what is 2+3 — use the tool"


def pump(app, seconds: float, until=None) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        app.processEvents()
        if until is not None and until():
            return True
        time.sleep(0.01)
    return until is None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a real chat model that calls tools (default: the fake engine)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mcp-demo-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # a throwaway profile and history
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
        os.environ[var] = str(tmp / var.lower())
    (tmp / "xdg_config_home" / "ggufdesk").mkdir(parents=True)
    server = ROOT / "tests" / "fixtures" / "mcp_server.py"
    (tmp / "xdg_config_home" / "ggufdesk" / "mcp.json").write_text(json.dumps(
        {"mcpServers": {"calculator": {"command": sys.executable, "args": [str(server), "only=add"]}}}))

    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    from ggufdesk.core.history import History
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow

    if args.model is None:
        os.environ["FAKE_ENGINE_CALL"] = 'add {"a": 2, "b": 3}'
        os.environ["FAKE_ENGINE_TOKENS_PER_S"] = "50"
        engine = EngineBridge(command=[sys.executable, str(ROOT / "tests" / "fixtures" / "fake_engine.py")])
        model = str(tmp / "scripted-tool-caller-instruct.gguf")
    else:
        engine = EngineBridge()
        model = str(args.model)
    history = History(tmp / "history.sqlite3")
    win = MainWindow(engine=engine, history=history, persist_settings=False)
    win.resize(1180, 760)
    win.show()
    loaded: list = []
    engine.loaded.connect(loaded.append)
    win.load_model(model, LoadSettings(n_ctx=4096))
    if not pump(app, 300, lambda: bool(loaded)):
        print("the model did not load")
        return 1
    win.send(PROMPT)
    if not pump(app, 300, lambda: any(c.state == "asking" for c in win.chat.cards)):
        print("no call card: the model answered without calling the tool:", win.chat.widgets[-1].text[:300])
        return 1
    pump(app, 0.5)
    args.out.mkdir(parents=True, exist_ok=True)
    win.grab().save(str(args.out / "mcp-call-card.png"))
    card = next(c for c in win.chat.cards if c.state == "asking")
    print(f"call card: {card.server}/{card.tool} {card.args.text()!r}; pressing Allow once")
    finished: list[str] = []
    win.answer_finished.connect(finished.append)
    card.allow_btn.click()
    pump(app, 300, lambda: not win.session.busy and card.state != "running" and bool(finished))
    pump(app, 0.5)
    win.grab().save(str(args.out / "mcp-answer.png"))
    answer = win.chat.widgets[-1].text
    print(f"tool result: {card.text!r}; answer: {answer!r}")
    print(f"screenshots: {args.out / 'mcp-call-card.png'}, {args.out / 'mcp-answer.png'}")
    win.close()
    engine.shutdown(timeout=5)
    history.close()
    return 0 if card.text in answer else 1


if __name__ == "__main__":
    sys.exit(main())
