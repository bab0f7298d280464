"""The engine client over the fake engine: loads by id, the watchdog, stop escalation, restarts that
never block the caller, and what the user is told after a crash."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient, EngineError

FAKE = [sys.executable, str(Path(__file__).resolve().parents[1] / "fixtures" / "fake_engine.py")]


def client(**kw) -> EngineClient:
    kw.setdefault("ping_interval", 0.2)
    kw.setdefault("hang_timeout", 5.0)  # (not so short that a loaded machine's pause looks like a hang)
    kw.setdefault("cancel_grace", 0.5)
    return EngineClient(command=FAKE, **kw)


def wait_for(c: EngineClient, want, timeout: float = 120.0) -> list:
    """Queued events until one satisfies want(event); all of them, in order."""
    seen = []
    for ev in c.events(timeout=timeout):
        seen.append(ev)
        if want(ev):
            return seen
    raise AssertionError(f"not seen in {timeout} s; got {seen!r}")


def lifecycle(state: str, **kw):
    return lambda ev: isinstance(ev, P.Lifecycle) and ev.state == state and all(
        getattr(ev, k) == v for k, v in kw.items())


def test_any_error_for_the_load_fails_it_at_once(tmp_path):
    with client() as c:
        with pytest.raises(EngineError) as e:
            c.load(str(tmp_path / "bug-model.gguf"), timeout=60)
        assert e.value.event.kind == "bug"  # (a load that waited it out would say "did not load")
        assert c.state == "ready" and c.loaded is None
        loaded = c.load(str(tmp_path / "m-tmplerr.gguf"))  # a template notice: the load goes on
        assert loaded is not None and loaded.id is not None and c.state == "loaded"


def test_a_stopped_engine_is_detected_killed_and_restarted(tmp_path):
    with client() as c:
        c.load(str(tmp_path / "m.gguf"))
        old = c.pid
        os.kill(old, signal.SIGSTOP)
        seen = wait_for(c, lifecycle("loaded", restarted=True))
        hung = next(ev for ev in seen if isinstance(ev, P.Error))
        assert hung.kind == "hung" and "stopped responding" in hung.message
        assert "restarting" in hung.message
        assert c.pid != old and c.loaded is not None and c.loaded.model == str(tmp_path / "m.gguf")
        rid = c.generate(prompt="hello again", sampling={"max_tokens": 3})
        assert isinstance(list(c.stream(rid, timeout=120))[-1], P.Done)


def test_the_default_watchdog_tells_the_user_within_15_s():
    """A silent engine gets a Ping after PING_INTERVAL_S and is declared hung HANG_TIMEOUT_S after its
    last word; the supervisor looks every 0.5 s at most."""
    from ggufdesk.engine.link import client as C

    assert C.HANG_TIMEOUT_S + 0.5 <= 15 and C.PING_INTERVAL_S < C.HANG_TIMEOUT_S


def test_a_request_that_ignores_stop_gets_the_engine_killed_and_restarted(tmp_path):
    with client() as c:
        c.load(str(tmp_path / "m.gguf"))
        rid = c.generate(prompt="__stuck__ render for ever")
        c.cancel(rid)
        events = list(c.stream(rid, timeout=120))
        assert isinstance(events[-1], P.Error) and events[-1].kind == "hung"
        assert "did not stop within" in events[-1].message
        wait_for(c, lifecycle("loaded", restarted=True))
        rid = c.generate(prompt="next one", sampling={"max_tokens": 3})
        assert isinstance(list(c.stream(rid, timeout=120))[-1], P.Done)


def test_requests_during_a_restart_return_at_once_and_reach_the_new_engine(tmp_path, monkeypatch):
    gate = tmp_path / "engine-may-start"
    gate.touch()
    # Every start waits for this file, so the restart lasts until the test lets it go, however
    # slow the machine (a fixed start time would race a busy CI run).
    monkeypatch.setenv("FAKE_ENGINE_START_GATE", str(gate))
    with client(hang_timeout=10) as c:
        c.load(str(tmp_path / "m.gguf"))
        old_ready = c.ready
        gate.unlink()
        c.kill()
        wait_for(c, lambda ev: isinstance(ev, P.Error) and ev.kind == "crash")
        wait_for(c, lifecycle("starting", restarted=True))  # said just after the crash, not with it
        assert c.loaded is None and c.state in ("starting", "loading")  # no stale model
        rid = c.generate(prompt="queued while restarting", sampling={"max_tokens": 3})
        c.cancel("nothing-of-that-name")
        c.unload()
        c.load(str(tmp_path / "m.gguf"), wait=False)
        # The new engine is held before Ready; the old client waited for it in generate.
        assert c.ready is old_ready or c.ready is None
        gate.touch()
        events = list(c.stream(rid, timeout=120))
        assert isinstance(events[-1], P.Done) and events[-1].text == "Echo: queued while"
        wait_for(c, lambda ev: isinstance(ev, P.Loaded))  # then the unload, and the new load


def test_a_failed_reload_after_a_crash_says_why_no_model_is_loaded(tmp_path):
    model = tmp_path / "m.gguf"
    with client() as c:
        c.load(str(model))
        Path(str(model) + ".broken").write_text("truncated while loaded")
        c.kill()
        seen = wait_for(c, lambda ev: isinstance(ev, P.Error) and ev.kind == "crash")
        seen += wait_for(c, lambda ev: isinstance(ev, P.Lifecycle) and ev.state == "ready" and ev.reason)
        assert [ev.kind for ev in seen if isinstance(ev, P.Error)] == ["crash", "load"]
        why = seen[-1].reason
        assert why.startswith("the model could not be loaded again after the engine stopped "
                              "(killed by SIGKILL)") and why.endswith("the file is truncated")
        with pytest.raises(KnownError) as e:
            c.generate(prompt="hello?")
        assert str(e.value) == f"no model is loaded: {why}"


def test_an_engine_that_could_not_start_its_threads_says_to_ask_for_fewer(tmp_path):
    """`--threads 256` on a 2-core machine loads, then libgomp ends the engine at the first step: the
    user is told what to change, beside llama.cpp's own line."""
    with client(auto_restart=False) as c:
        c.load(str(tmp_path / "m.gguf"))
        events = list(c.stream(c.generate(prompt="__nothreads__", sampling={"max_tokens": 3}), timeout=120))
        err = events[-1]
        assert isinstance(err, P.Error) and err.kind == "crash"
        assert err.message == ("the engine stopped (exit code 1: libgomp: Thread creation failed: Resource "
                               "temporarily unavailable; this machine would not start that many threads: "
                               "set fewer (0 = one per core))")


def test_a_later_crash_of_the_restarted_engine_is_not_explained_by_the_first_ones_words(tmp_path):
    with client() as c:
        c.load(str(tmp_path / "m.gguf"))
        first = list(c.stream(c.generate(prompt="__nothreads__", sampling={"max_tokens": 3}), timeout=120))[-1]
        assert isinstance(first, P.Error) and "set fewer" in first.message
        wait_for(c, lifecycle("loaded", restarted=True))
        later = list(c.stream(c.generate(prompt="__crash__", sampling={"max_tokens": 8}), timeout=120))[-1]
        assert isinstance(later, P.Error) and later.kind == "crash"
        assert "set fewer" not in later.message and "libgomp" not in later.message + later.detail


def test_a_crashing_draft_is_blamed_on_the_draft_and_the_model_loads_without_it(tmp_path):
    with client() as c:
        with pytest.raises(EngineError) as e:
            c.load(str(tmp_path / "main.gguf"), draft=str(tmp_path / "crashdraft.gguf"),
                   speculation={"mode": "draft", "draft_model": str(tmp_path / "crashdraft.gguf")})
        msg = str(e.value)
        assert "the draft model crashdraft.gguf" in msg and "main.gguf" not in msg
        assert "loading the model without it" in msg
        loaded = wait_for(c, lambda ev: isinstance(ev, P.Loaded))[-1]
        assert loaded.model == str(tmp_path / "main.gguf") and loaded.draft is None


def test_invalid_unicode_is_replaced_not_a_crash(tmp_path):
    with client() as c:
        c.load(str(tmp_path / "m.gguf"))
        bad = b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")  # how Python reads bad bytes
        rid = c.generate(prompt=bad, sampling={"max_tokens": 4})
        events = list(c.stream(rid, timeout=120))
        assert isinstance(events[-1], P.Done)
        assert "caf\ufffd" in "".join(ev.text for ev in events if isinstance(ev, P.Token))


def test_without_auto_restart_a_dead_engine_refuses_plainly(tmp_path):
    with client(auto_restart=False) as c:
        c.load(str(tmp_path / "m.gguf"))
        c.kill()
        wait_for(c, lifecycle("failed"))
        with pytest.raises(KnownError, match="the engine is not running"):
            c.generate(prompt="x")
        with pytest.raises(KnownError, match="the engine is not running"):
            c.load(str(tmp_path / "m.gguf"))


def test_an_engine_that_never_starts_is_reported(tmp_path):
    c = EngineClient(command=[sys.executable, "-c", "import sys; print('boom', file=sys.stderr)"])
    try:
        with pytest.raises(KnownError, match=r"did not start \(exit code 0\): boom"):
            c.start(timeout=120)
        assert c.state == "failed"
    finally:
        c.shutdown()


def test_the_start_failure_waits_for_the_engines_last_words(monkeypatch):
    """A loaded machine: the exit is seen before the stderr reader ran; the message still says why."""
    import threading

    from ggufdesk.engine.link import client as client_module

    real = client_module.EngineClient._read_stderr
    go = threading.Event()

    def late_reader(self, popen):
        go.wait(2.0)  # descheduled past the moment the supervisor sees the exit
        real(self, popen)

    monkeypatch.setattr(client_module.EngineClient, "_read_stderr", late_reader)
    c = EngineClient(command=[sys.executable, "-c", "import sys; print('boom', file=sys.stderr)"])
    try:
        with pytest.raises(KnownError, match=r"did not start \(exit code 0\): boom"):
            c.start(timeout=120)
    finally:
        c.shutdown()


def test_a_shutdown_during_the_engines_spawn_leaves_no_engine_running(monkeypatch):
    """The router's storm saw three engines with two allowed: a shutdown that came while the
    supervisor was still spawning returned at once, and the engine spawned after it lived on."""
    import subprocess
    import threading
    import time

    from ggufdesk.engine.link import client as client_module

    spawning, spawned = threading.Event(), []
    real = subprocess.Popen

    def slow_popen(*a, **kw):  # a fork on a loaded machine: the shutdown arrives meanwhile
        spawning.set()
        time.sleep(0.5)
        p = real(*a, **kw)
        spawned.append(p)
        return p

    monkeypatch.setattr(client_module.subprocess, "Popen", slow_popen)
    c = EngineClient(command=[sys.executable, "-c", "import time; time.sleep(120)"])
    c.start(wait=False)
    assert spawning.wait(60)
    c.shutdown(timeout=0.5)
    assert all(p.poll() is not None for p in spawned)  # (it never became ready: nothing to wait for)
    c._supervisor.join(30)
    assert not c._supervisor.is_alive()
    assert all(p.poll() is not None for p in spawned)


def test_a_shutdown_before_the_queued_start_spawns_nothing(monkeypatch):
    import threading

    from ggufdesk.engine.link import client as client_module

    spawned = []
    gate = threading.Event()
    real_spawn = EngineClient._spawn

    def held_spawn(self, **kw):  # the supervisor picks the start job up only after the shutdown
        gate.wait(60)
        return real_spawn(self, **kw)

    monkeypatch.setattr(EngineClient, "_spawn", held_spawn)
    monkeypatch.setattr(client_module.subprocess, "Popen", lambda *a, **kw: spawned.append(a) or 1 / 0)
    c = EngineClient(command=[sys.executable, "-c", "import time; time.sleep(120)"])
    c.start(wait=False)
    c.shutdown(timeout=0.5)
    gate.set()
    c._supervisor.join(30)
    assert not c._supervisor.is_alive() and spawned == []
    assert c.state == "stopped"  # (not "starting": the queued start announced nothing)
