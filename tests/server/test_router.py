"""The router in a live server over the fake engine: requests by model, one load, idle unload, eviction, storms."""
from __future__ import annotations

import asyncio
import re
import threading
import time

import httpx
import psutil
import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link.client import EngineClient
from ggufdesk.server.admission import Admission
from ggufdesk.server.budget import Budget, Need, planner_need
from ggufdesk.server.pool import EnginePool
from ggufdesk.server.router import ModelEntry, Router
from ggufdesk.server.runner import ServerRunner
from ggufdesk.server.service import ServerConfig, Service
from tests.server.serving import FAKE_ENGINE

MB = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class RouterServer:
    """A server on a thread of this process, routing over fake engines (one process per loaded model)."""

    def __init__(self, ids: tuple[str, ...] = ("a", "b", "c"), *, env: dict | None = None, budget_mb: int = 10_000,
                 need_mb: dict | None = None, idle: float = 600, max_loaded: int = 0, clock=time.monotonic,
                 parallel: int = 4, need=None, paths: dict | None = None) -> None:
        self.spawned: list[EnginePool] = []
        self.lock = threading.Lock()
        env = {"FAKE_ENGINE_TOKENS_PER_S": "0", **(env or {})}
        paths = paths or {}
        entries = [ModelEntry(id=i, path=paths.get(i, f"/models/{i}.gguf"), load=LoadSettings(n_ctx=512))
                   for i in ids]
        need_mb = need_mb or {}

        def factory(e: ModelEntry, path: str) -> EnginePool:
            pool = EnginePool(model=path, load=e.load, model_id=e.id,
                              client_factory=lambda **kw: EngineClient(command=FAKE_ENGINE, env=env, **kw))
            with self.lock:
                self.spawned.append(pool)
            return pool

        self.router = Router(entries=entries, pool_factory=factory, budget=Budget(ram=budget_mb * MB),
                             need=need or (lambda path, e: Need(need_mb.get(e.id, 100) * MB)), idle_unload_s=idle,
                             max_loaded=max_loaded, clock=clock)
        self.svc = Service(router=self.router, config=ServerConfig(parallel=parallel, max_queue=500),
                           admission=Admission(slots=parallel, max_queue=500, memory_check=lambda: None))
        self.runner = ServerRunner(self.svc, port=0)
        self.url = self.runner.start_thread()

    def chat(self, model: str, text: str = "hello", **kw) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **kw}
        return httpx.post(self.url + "/v1/chat/completions", json=body, timeout=120)

    def alive(self) -> list[int]:
        """Engine processes of this server that are running."""
        pids = [p.engine_pid for p in self.spawned if p.engine_pid]
        return [pid for pid in pids if _running(pid)]

    def metric(self, name: str) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics").text
        return {m.group(1) or "": float(m.group(2)) for m in re.finditer(rf"^{name}(\{{.*?\}})? (\S+)$", text, re.M)}

    def close(self) -> None:
        self.runner.stop()
        self.svc.shutdown()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


@pytest.fixture
def make():
    made: list[RouterServer] = []

    def build(*args, **kw) -> RouterServer:
        made.append(RouterServer(*args, **kw))
        return made[-1]

    yield build
    for s in made:
        s.close()


def test_requests_alternate_between_models_each_loaded_once(make):
    s = make()
    for model in ("a", "b", "a", "b"):
        r = s.chat(model)
        assert r.status_code == 200 and r.json()["model"] == model
    assert len(s.spawned) == 2 and len(s.alive()) == 2
    assert s.metric("ggufdesk_model_loads_total") == {'{model="a"}': 1.0, '{model="b"}': 1.0}
    assert s.metric("ggufdesk_models_loaded") == {"": 2.0}
    listed = {m["id"]: m for m in httpx.get(s.url + "/v1/models").json()["data"]}
    assert set(listed) == {"a", "b", "c"}  # every servable model
    assert listed["a"]["status"] == {"value": "ready"} and listed["a"]["loaded"] and not listed["c"]["loaded"]
    assert listed["a"]["ram_bytes"] == 100 * MB and listed["c"]["state"] == "unloaded"


def test_four_concurrent_requests_for_an_unloaded_model_start_one_engine_and_one_load(make, tmp_path):
    gate = tmp_path / "load-may-finish"  # the load lasts until the test opens this, however busy the machine
    s = make(env={"FAKE_ENGINE_LOAD_GATE": str(gate)})
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(s.chat("a"))) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: s.router.slots["a"].waiting == 4)
    assert s.metric("ggufdesk_models_loading") == {"": 1.0}
    assert s.metric("ggufdesk_model_load_waiting_requests") == {'{model="a"}': 4.0}
    load = next(m for m in httpx.get(s.url + "/v1/models").json()["data"] if m["id"] == "a")["load"]
    assert load["waiting"] == 4 and load["stage"] in ("queued", "starting", "model")
    gate.touch()
    for t in threads:
        t.join(60)
    assert [r.status_code for r in results] == [200] * 4
    assert len(s.spawned) == 1 and len(s.alive()) == 1
    assert s.metric("ggufdesk_model_loads_total") == {'{model="a"}': 1.0}


def test_idle_unload_ends_the_engine_process_on_a_fake_clock(make):
    clock = FakeClock()
    s = make(clock=clock, idle=600)
    assert s.chat("a").status_code == 200
    (pid,) = s.alive()
    server = psutil.Process()
    assert pid in {c.pid for c in server.children(recursive=True)}
    clock.t += 599
    time.sleep(1.5)  # the reaper looks every second
    assert s.router.slots["a"].state == "ready"
    clock.t += 2
    wait_until(lambda: s.router.slots["a"].state == "unloaded")
    wait_until(lambda: not _running(pid))  # its memory went with it
    assert pid not in {c.pid for c in server.children(recursive=True) if _running(c.pid)}
    assert s.metric("ggufdesk_model_unloads_total") == {'{model="a",reason="idle"}': 1.0}
    assert s.chat("a").status_code == 200  # and it comes back when asked
    assert s.metric("ggufdesk_model_loads_total") == {'{model="a"}': 2.0}


def test_least_recently_used_idle_model_is_evicted_under_a_small_budget(make):
    s = make(budget_mb=250)
    for model in ("a", "b", "a", "c"):
        assert s.chat(model).status_code == 200
    states = {i: sl.state for i, sl in s.router.slots.items()}
    assert states == {"a": "ready", "b": "unloaded", "c": "ready"}
    assert len(s.alive()) == 2
    assert s.metric("ggufdesk_model_unloads_total") == {'{model="b",reason="evicted"}': 1.0}


def test_a_model_that_can_never_fit_is_a_400_with_the_numbers(make):
    s = make(budget_mb=250, need_mb={"c": 900})
    r = s.chat("c")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "model_too_large" and err["param"] == "model"
    assert "900 MiB of RAM" in err["message"] and "250 MiB of RAM" in err["message"]
    assert s.spawned == []  # never started


def test_the_planner_refuses_a_real_model_over_the_budget(make, tiny_model):
    s = make(ids=("tiny",), budget_mb=0, paths={"tiny": str(tiny_model)},
             need=lambda path, e: planner_need(path, e.load, e.speculation))
    err = s.chat("tiny").json()["error"]
    assert err["code"] == "model_too_large" and "tiny-target.gguf" in err["message"]
    assert re.search(r"needs \d+ MiB of RAM", err["message"]) and "may use 0 MiB of RAM" in err["message"]


def test_a_model_that_fails_to_load_fails_only_its_own_requests(make):
    s = make(ids=("good", "bad"))  # the fake engine refuses a path with "bad" in it, as llama.cpp a broken file
    out: dict[str, list[int]] = {"good": [], "bad": []}

    def go(model: str) -> None:
        r = s.chat(model)
        out[model].append(r.status_code)
        if model == "bad":
            assert r.json()["error"]["code"] == "model_load_failed"

    threads = [threading.Thread(target=go, args=(m,)) for m in ("good", "bad") * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out == {"good": [200] * 3, "bad": [500] * 3}
    assert sum(1 for p in s.spawned if p.model_id == "bad") == 1  # later requests failed at once
    assert httpx.get(s.url + "/health").status_code == 200


def test_unknown_models_are_404_listing_the_ids_and_paths_are_refused(make):
    s = make()
    r = s.chat("gpt-4o")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "a, b, c" in r.json()["error"]["message"]
    for bad in ("../../../etc/passwd", "/models/a.gguf", "..\\a"):
        r = s.chat(bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_model"
    r = httpx.post(s.url + "/v1/messages", json={"model": "claude-x", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert s.spawned == []


def test_a_client_that_leaves_while_its_model_loads_leaves_only_its_own_wait(make, tmp_path):
    gate = tmp_path / "load-may-finish"
    s = make(env={"FAKE_ENGINE_LOAD_GATE": str(gate)})

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            leaver = asyncio.ensure_future(c.post(s.url + "/v1/chat/completions", json=body))
            stayer = asyncio.ensure_future(c.post(s.url + "/v1/chat/completions", json=body))
            while s.router.slots["a"].waiting < 2:
                await asyncio.sleep(0.02)
            leaver.cancel()
            await asyncio.gather(leaver, return_exceptions=True)
            gate.touch()
            assert (await stayer).status_code == 200

    asyncio.run(main())
    wait_until(lambda: s.router.slots["a"].waiting == 0 and s.router.slots["a"].active == 0)
    assert len(s.spawned) == 1


def test_a_load_storm_completes_or_cleanly_503s_with_no_orphan_engine(make):
    """50 requests naming 5 models with room for 2: every request ends 200 or 503, never more than two
    engines at once, and none left behind."""
    s = make(ids=("m1", "m2", "m3", "m4", "m5"), budget_mb=250, parallel=4,
             env={"FAKE_ENGINE_LOAD_S": "0.1", "FAKE_ENGINE_REPLY_TOKENS": "3"})
    most = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            most[0] = max(most[0], len(s.alive()))
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()

    async def storm() -> list[int]:
        async with httpx.AsyncClient(timeout=300) as c:
            async def one(i: int) -> int:
                body = {"model": f"m{i % 5 + 1}", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 3}
                r = await c.post(s.url + "/v1/chat/completions", json=body)
                if r.status_code == 503:
                    assert r.headers["retry-after"] and r.json()["error"]["type"] == "server_error"
                return r.status_code

            return await asyncio.gather(*(one(i) for i in range(50)))

    codes = asyncio.run(storm())
    done.set()
    assert set(codes) <= {200, 503} and codes.count(200) >= 10
    assert most[0] <= 2 and len(s.alive()) <= 2
    pids = [p.engine_pid for p in s.spawned]
    s.close()
    assert not [pid for pid in pids if pid and _running(pid)]  # no orphan engine


def test_ggufdesk_ps_shows_what_a_running_server_has_loaded(make, capsys):
    import json

    from ggufdesk.cli import main

    s = make()
    assert main(["ps", "--url", s.url]) == 0
    assert "no model loaded" in capsys.readouterr().out
    s.chat("b")
    assert main(["ps", "--url", s.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["models"]
    assert [m["id"] for m in shown] == ["b"] and shown[0]["state"] == "ready" and shown[0]["ram_bytes"] == 100 * MB
    assert main(["ps", "--url", s.url]) == 0
    out = capsys.readouterr().out
    assert "b " in out and "100 MiB" in out and "10 min" in out
    assert main(["ps", "--url", s.url, "--all", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["models"]) == 3


def test_ggufdesk_ps_without_a_server_says_so(capsys):
    import json
    import socket

    from ggufdesk.cli import main

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["ps", "--url", f"http://127.0.0.1:{port}", "--json"]) == 1
    assert "no server answers" in json.loads(capsys.readouterr().out)["error"]
    assert main(["ps", "--url", "file:///etc/passwd"]) == 1
    assert "http://" in capsys.readouterr().err


def test_embeddings_load_the_named_model_like_a_generation(make):
    s = make()
    r = httpx.post(s.url + "/v1/embeddings", json={"model": "c", "input": ["one", "two"]}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "c" and len(r.json()["data"]) == 2
    assert s.router.slots["c"].state == "ready" and s.router.slots["c"].active == 0
    assert httpx.post(s.url + "/v1/embeddings", json={"model": "nope", "input": "x"}).status_code == 404
