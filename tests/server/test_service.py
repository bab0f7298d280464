"""The service layer in-process over the fake engine: loading, crashes, full queues, low memory, disconnects."""
from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tests.server.serving import InProcess

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400}


@pytest.fixture
def server(request):
    params = getattr(request, "param", {})
    s = InProcess(**params)
    yield s
    s.close()


async def wait_for(pred, timeout: float = 20.0) -> None:
    """Wait until pred() holds (the server's state changes on another thread)."""
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.01)


def test_health_says_loading_until_the_model_is_ready_then_ok(tmp_path):
    gate = tmp_path / "load-may-finish"  # the load lasts until the test opens this, however busy the machine
    s = InProcess(env={"FAKE_ENGINE_LOAD_GATE": str(gate)}, load=False)
    try:
        loader = threading.Thread(target=lambda: s.pool.start(), daemon=True)
        loader.start()
        r = httpx.get(s.url + "/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert r.headers["retry-after"]
        gate.touch()
        assert s.pool.wait_ready(60)
        r = httpx.get(s.url + "/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
    finally:
        s.close()


@pytest.mark.parametrize("server", [{"memory_check": lambda: "the server is low on memory"}], indirect=True)
def test_low_memory_gives_503_instead_of_dying(server):
    r = httpx.post(server.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "low_memory" and int(r.headers["retry-after"]) >= 1
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("server", [{"parallel": 1, "max_queue": 1, "env": {"FAKE_ENGINE_TOKENS_PER_S": "20"}}],
                         indirect=True)
def test_a_full_queue_gives_503_with_retry_after(server):
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            body = dict(CHAT, max_tokens=3)
            first = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            await wait_for(lambda: server.svc.admission.running == 1)
            second = asyncio.create_task(c.post("/v1/chat/completions", json=body))
            await wait_for(lambda: server.svc.admission.queued == 1)
            third = await c.post("/v1/chat/completions", json=body)
            assert third.status_code == 503 and third.json()["error"]["code"] == "overloaded"
            assert int(third.headers["retry-after"]) >= 1
            assert (await first).status_code == 200 and (await second).status_code == 200

    asyncio.run(main())


@pytest.mark.parametrize("server", [{"env": {"FAKE_ENGINE_TOKENS_PER_S": "20"}}], indirect=True)
def test_a_disconnected_stream_is_cancelled_and_frees_its_slot(server):
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            async with c.stream("POST", "/v1/chat/completions", json=dict(CHAT, stream=True)) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if '"content"' in line:
                        break
                assert server.svc.admission.running == 1
            # leaving the block closes the connection mid-stream
        await wait_for(lambda: server.svc.admission.running == 0)

    asyncio.run(main())
    text = httpx.get(server.url + "/metrics").text
    assert 'ggufdesk_request_failures_total{reason="disconnected"} 1.0' in text


@pytest.mark.parametrize("server", [{"env": {"FAKE_ENGINE_TOKENS_PER_S": "20"}}], indirect=True)
def test_a_disconnected_plain_request_is_cancelled_too(server):
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            task = asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
            await wait_for(lambda: server.svc.admission.running == 1)
            task.cancel()  # httpx closes the connection
            await asyncio.gather(task, return_exceptions=True)
        await wait_for(lambda: server.svc.admission.running == 0)

    asyncio.run(main())


@pytest.mark.parametrize("server", [{"parallel": 1, "max_queue": 4, "env": {"FAKE_ENGINE_TOKENS_PER_S": "20"}}],
                         indirect=True)
def test_a_client_that_leaves_while_queued_leaves_the_queue(server):
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            first = asyncio.create_task(c.post("/v1/chat/completions", json=dict(CHAT, max_tokens=20)))
            await wait_for(lambda: server.svc.admission.running == 1)
            queued = asyncio.create_task(c.post("/v1/chat/completions", json=CHAT))
            await wait_for(lambda: server.svc.admission.queued == 1)
            queued.cancel()
            await asyncio.gather(queued, return_exceptions=True)
            await wait_for(lambda: server.svc.admission.queued == 0)
            assert (await first).status_code == 200
        await wait_for(lambda: server.svc.admission.running == 0)

    asyncio.run(main())


def test_an_engine_crash_fails_the_request_cleanly_and_the_server_recovers(server):
    ready_again = threading.Event()
    states: list[str] = []

    def on_state(state: str) -> None:
        states.append(state)
        if state == "ready" and "loading" in states:
            ready_again.set()

    server.pool.on_state = on_state
    crash = {"model": "fake-model", "messages": [{"role": "user", "content": "__crash__"}], "max_tokens": 50}
    r = httpx.post(server.url + "/v1/chat/completions", json=dict(crash, stream=True), timeout=60)
    assert r.status_code == 200  # the first tokens came before the crash: the error arrives in the stream
    assert '"error"' in r.text and "engine_restarting" in r.text
    assert ready_again.wait(60)
    r = httpx.post(server.url + "/v1/chat/completions", json=dict(CHAT, max_tokens=3), timeout=60)
    assert r.status_code == 200
    assert server.svc.admission.running == 0


def test_an_engine_error_before_any_token_is_an_http_error(server):
    r = httpx.post(server.url + "/v1/messages", json={
        "model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": "__error__"}]})
    assert r.status_code == 500 and r.json()["type"] == "error"
    assert server.svc.admission.running == 0


def test_each_api_tells_the_engine_whether_its_client_reads_the_tokens_as_they_come(server, monkeypatch):
    # the engine reads waiting prompts a whole batch at a time beside answers nobody streams
    # (engine/batching/scheduler.py); every route passes its request's `stream` on
    from ggufdesk.engine.link.client import EngineClient

    sent: list[bool] = []
    generate = EngineClient.generate

    def recording(self, **kw):
        sent.append(kw.get("stream", True))
        return generate(self, **kw)

    monkeypatch.setattr(EngineClient, "generate", recording)
    msgs = [{"role": "user", "content": "hi"}]
    bodies = [("/v1/chat/completions", {"model": "fake-model", "messages": msgs, "max_tokens": 2}),
              ("/v1/completions", {"model": "fake-model", "prompt": "hi", "max_tokens": 2}),
              ("/v1/messages", {"model": "fake-model", "messages": msgs, "max_tokens": 2}),
              ("/completion", {"prompt": "hi", "n_predict": 2}),
              ("/v1/responses", {"model": "fake-model", "input": "hi", "max_output_tokens": 2}),
              ("/api/chat", {"model": "fake-model", "messages": msgs, "options": {"num_predict": 2}}),
              ("/api/generate", {"model": "fake-model", "prompt": "hi", "options": {"num_predict": 2}})]
    for path, body in bodies:
        for stream in (False, True):
            r = httpx.post(server.url + path, json={**body, "stream": stream}, timeout=60)
            assert r.status_code == 200, (path, r.text)
            assert sent.pop() is stream, path
    r = httpx.post(server.url + "/api/chat", json=bodies[5][1], timeout=60)  # Ollama streams unless told not to
    assert r.status_code == 200 and sent.pop() is True
