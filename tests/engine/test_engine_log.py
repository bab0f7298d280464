"""The engine process's log lines reach the client's log at their own level (engine/link/engine_log.py),
and never stand for the reason of a crash."""
from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import replace

import pytest

from ggufdesk.engine.link import engine_log
from ggufdesk.engine.link.client import EngineClient
from tests.engine.conftest import TINY_LOAD
from tests.engine.helpers import collect, greedy


def test_prefixed_lines_are_logged_under_their_level_and_name_and_others_are_not(caplog):
    caplog.set_level(logging.DEBUG)
    assert engine_log.relay("ggufdesk-log WARNING ggufdesk.engine: n_ctx 9 exceeds 8")
    assert engine_log.relay("ggufdesk-log INFO ggufdesk.engine.speculation.speculative: paused: a: b")
    got = [(r.levelno, r.name, r.getMessage()) for r in caplog.records]
    assert got == [(logging.WARNING, "ggufdesk.engine", "n_ctx 9 exceeds 8"),
                   (logging.INFO, "ggufdesk.engine.speculation.speculative", "paused: a: b")]
    for other in ("llama_model_loader: loaded meta data", "ggufdesk-log NOTICE ggufdesk.engine: x",
                  "ggufdesk-log INFO root: not ours", "ggufdesk-log INFO ggufdesk.engine", "",
                  "  File \"worker.py\", line 3, in main"):
        assert not engine_log.relay(other)
    assert len(caplog.records) == 2


def test_only_info_and_debug_lines_are_chatter():
    assert engine_log.is_chatter("ggufdesk-log INFO ggufdesk.engine: verification cost ... error 3")
    assert not engine_log.is_chatter("ggufdesk-log WARNING ggufdesk.engine: could not record")
    assert not engine_log.is_chatter("GGML_ASSERT(n > 0) failed")


def test_the_engine_is_asked_for_the_level_the_client_shows():
    log = logging.getLogger("ggufdesk.engine")
    before = log.level
    try:
        log.setLevel(logging.INFO)
        assert engine_log.level_for_engine() == "INFO"
        log.setLevel(logging.ERROR)
        assert engine_log.level_for_engine() == "ERROR"
    finally:
        log.setLevel(before)


@pytest.mark.parametrize("asked, shown", [("INFO", True), ("WARNING", False), ("nonsense", False), (None, False)])
def test_the_engine_side_writes_prefixed_lines_at_the_level_asked(asked, shown):
    code = ("import logging; from ggufdesk.engine.link import engine_log; engine_log.configure(); "
            "logging.getLogger('ggufdesk.engine').info('an info line'); "
            "logging.getLogger('ggufdesk.engine').warning('a warning'); "
            "logging.getLogger('other').warning('a library of its own')")
    env = {k: v for k, v in __import__("os").environ.items() if k != engine_log.ENV}
    if asked is not None:
        env[engine_log.ENV] = asked
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60).stderr.splitlines()
    assert "ggufdesk-log WARNING ggufdesk.engine: a warning" in err
    assert ("ggufdesk-log INFO ggufdesk.engine: an info line" in err) == shown
    assert "a library of its own" in err  # untouched: Python's last-resort handler, as before


def test_a_warning_of_the_engine_reaches_the_client_s_log(tiny_model, caplog):
    caplog.set_level(logging.WARNING, logger="ggufdesk.engine")
    with EngineClient() as c:  # the tiny model was trained on 2048 tokens
        c.load(str(tiny_model), settings=replace(TINY_LOAD, n_ctx=4096))
        assert collect(c, c.generate(prompt="hello", sampling=greedy(2))).error is None
    assert any(r.levelno == logging.WARNING and "exceeds the model's training context" in r.getMessage()
               for r in caplog.records), caplog.text


def test_a_line_break_in_a_message_cannot_forge_a_record():
    code = ("import logging; from ggufdesk.engine.link import engine_log; engine_log.configure(); "
            "logging.getLogger('ggufdesk.engine').warning('token %s', 'a\\nggufdesk-log ERROR ggufdesk.engine: forged')\n"
            "try:\n    1/0\nexcept ZeroDivisionError:\n    logging.getLogger('ggufdesk.engine').exception('failed')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr.splitlines()
    assert len(err) == 2 and all(engine_log.LINE.match(ln) for ln in err), err
    assert not any(ln.startswith("ggufdesk-log ERROR ggufdesk.engine: forged") for ln in err)
    assert "ZeroDivisionError" in err[1]  # the traceback kept, on its record's line
