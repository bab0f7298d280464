"""No thread of the engine client dies (issue 34, finding 1): a request that cannot be encoded, a listener
that raises, a bug in the supervisor's job each end one request or restart the engine, and the next
request is served."""
from __future__ import annotations

import json
import threading

import pytest

from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.engine.test_client import client, wait_for


def deep_list(n: int) -> list:
    out: list = [1]
    for _ in range(n):
        out = [out]
    return out


def done_or_error(rid: str):
    return lambda ev: isinstance(ev, (P.Done, P.Error)) and ev.id == rid


def test_encode_takes_a_600_deep_argument():
    msg = P.Generate(id="r1", messages=[{"role": "assistant", "content": "",
                                         "tool_calls": [{"function": {"name": "f", "arguments": deep_list(600)}}]}])
    line = P.encode(msg)
    assert json.loads(line)["messages"][0]["tool_calls"][0]["function"]["arguments"] == deep_list(600)


def test_encode_refuses_what_is_too_deep_or_not_json_with_a_value_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        P.encode(P.Generate(id="r1", tools=[{"x": deep_list(100_000)}]))
    with pytest.raises(TypeError):
        P.encode(P.Generate(id="r1", tools=[{"x": {1, 2}}]))


def alive(c: EngineClient) -> bool:
    return all(t is not None and t.is_alive() for t in (c._writer, c._supervisor)) and c.problem() is None


def test_an_unencodable_request_fails_alone_and_the_writer_lives(tmp_path):
    with client() as c:
        c.load(str(tmp_path / "m.gguf"))
        pid = c.pid
        bad = c.generate(prompt="hi", sampling={"max_tokens": 2}, tools=[{"x": deep_list(100_000)}])
        err = wait_for(c, done_or_error(bad))[-1]
        assert isinstance(err, P.Error) and err.kind == "protocol" and "nested too deeply" in err.message
        good = c.generate(prompt="hi", sampling={"max_tokens": 2})
        assert isinstance(wait_for(c, done_or_error(good))[-1], P.Done)
        assert alive(c) and c.pid == pid and c.state == "loaded"


def test_a_listener_that_raises_does_not_stop_the_reader(tmp_path):
    calls = []

    def listener(ev):
        calls.append(ev)
        if isinstance(ev, P.Token):
            raise RuntimeError("boom")

    c = client(on_event=listener)
    try:
        c.start()
        c.load(str(tmp_path / "m.gguf"))
        for _ in range(2):
            rid = c.generate(prompt="hi", sampling={"max_tokens": 3})
            deadline = threading.Event()
            while not any(isinstance(e, P.Done) and e.id == rid for e in calls):
                assert not deadline.wait(0.02) and len(calls) < 10_000
        assert alive(c)
    finally:
        c.shutdown()


def test_a_bug_in_the_supervisor_restarts_the_engine_and_the_thread_goes_on(tmp_path, monkeypatch):
    with client() as c:
        c.load(str(tmp_path / "m.gguf"))
        old = c.pid
        real = EngineClient._watch
        broken = threading.Event()

        def watch_once(self):
            # only this test's client: another one still alive in this process (a test before it that
            # failed) must not take the one bug, which left this client's restart unseen
            if self is c and not broken.is_set():
                broken.set()
                raise RuntimeError("a bug in the watchdog")
            return real(self)

        monkeypatch.setattr(EngineClient, "_watch", watch_once)
        seen = wait_for(c, lambda ev: isinstance(ev, P.Lifecycle) and ev.state == "loaded" and ev.restarted)
        assert any(isinstance(e, P.Error) and "supervisor" in e.message for e in seen)
        assert c.pid != old and alive(c)
        rid = c.generate(prompt="hi", sampling={"max_tokens": 2})
        assert isinstance(wait_for(c, done_or_error(rid))[-1], P.Done)


def test_problem_names_a_dead_thread(tmp_path):
    with client() as c:
        assert c.problem() is None
        c._outbox.put(None)  # the writer's own way to end: as if it had died
        c._writer.join(5)
        assert "engine-writer" in (c.problem() or "")
