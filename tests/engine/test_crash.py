"""A killed engine is reported, restarted and reloaded; nothing hangs and the next request works."""
from __future__ import annotations

import os
import signal
import time

from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.engine.conftest import TINY_LOAD
from tests.engine.helpers import collect, greedy


def test_sigkill_mid_generation_is_reported_and_engine_restarts(tiny_model):
    with EngineClient(auto_restart=True) as c:
        c.load(str(tiny_model), settings=TINY_LOAD)
        old_pid = c.pid
        rid = c.generate(prompt="the cat", sampling=greedy(100000 // 200))
        events = []
        for ev in c.stream(rid):
            events.append(ev)
            if isinstance(ev, P.Token) and len(events) == 5:
                os.kill(old_pid, signal.SIGKILL)
        err = events[-1]
        assert isinstance(err, P.Error) and err.kind == "crash" and err.id == rid
        assert "SIGKILL" in err.message and "restarting" in err.message
        deadline = time.monotonic() + 60
        while (c.loaded is None or c.pid == old_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.pid != old_pid and c.loaded is not None  # restarted and reloaded the same model
        assert c.loaded.model == str(tiny_model)
        assert collect(c, c.generate(prompt="the cat", sampling=greedy(3))).error is None


def test_without_auto_restart_the_crash_is_final_but_clean(tiny_model):
    with EngineClient(auto_restart=False) as c:
        c.load(str(tiny_model), settings=TINY_LOAD)
        c.kill()
        c.proc.wait()
        time.sleep(0.2)
        assert not c.alive
        try:
            c.generate(prompt="x")
        except Exception as e:  # noqa: BLE001
            assert "not running" in str(e)
        else:
            raise AssertionError("generate on a dead engine must raise")


def test_shutdown_is_prompt(tiny_model):
    c = EngineClient()
    c.start()
    t = time.monotonic()
    c.shutdown(timeout=5)
    assert c.proc.returncode == 0 and time.monotonic() - t < 5
