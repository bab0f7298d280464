"""The router's decisions over stand-in engines: one load per model, LRU eviction, idle unload on a fake clock."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.server import router as router_mod
from ggufdesk.server.budget import Budget, Need
from ggufdesk.server.errors import ApiError
from ggufdesk.server.router import ModelEntry, Router, looks_like_path

MB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class StubPool:
    """What the router asks of an EnginePool, with a load that waits until told (or fails)."""

    def __init__(self, entry: ModelEntry, path: str, gate: threading.Event | None, fail: str | None) -> None:
        self.model_id, self.model = entry.id, path
        self.state, self.error, self.loaded, self.status, self.tool_format = "starting", None, None, {}, None
        self.logprobs_supported = True
        self.gate, self.fail = gate, fail
        self.shut = False

    def start(self) -> None:
        self.state = "loading"
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail:
            self.state, self.error = "failed", self.fail
            raise KnownError(self.fail)
        self.state = "ready"

    def shutdown(self) -> None:
        self.shut = True


class Harness:
    def __init__(self, ids=("a", "b", "c"), *, budget_mb: int = 1000, need_mb: dict | None = None, **kw) -> None:
        self.clock = Clock()
        self.pools: list[StubPool] = []
        self.gate: threading.Event | None = None
        self.fail: dict[str, str] = {}
        self.loads: list[str] = []
        self.unloads: list[tuple[str, str]] = []
        need_mb = need_mb or {}
        entries = [ModelEntry(id=i, path=f"/nowhere/{i}.gguf", load=LoadSettings(n_ctx=512)) for i in ids]
        self.router = Router(entries=entries, pool_factory=self.factory, budget=Budget(ram=budget_mb * MB),
                             need=lambda path, e: Need(need_mb.get(e.id, 100) * MB), clock=self.clock, **kw)
        self.router.on_load = self.loads.append
        self.router.on_unload = lambda i, why: self.unloads.append((i, why))

    def factory(self, entry: ModelEntry, path: str) -> StubPool:
        pool = StubPool(entry, path, self.gate, self.fail.get(entry.id))
        self.pools.append(pool)
        return pool

    async def use(self, model_id: str, keep_alive: float | None = None) -> None:
        slot = await self.router.acquire(model_id)
        self.clock.t += 1
        self.router.release(slot, keep_alive)

    def live(self) -> list[str]:
        return [p.model_id for p in self.pools if not p.shut]


def test_four_requests_for_an_unloaded_model_make_one_load():
    h = Harness()
    h.gate = threading.Event()

    async def main() -> None:
        waiters = [asyncio.ensure_future(h.router.acquire("a")) for _ in range(4)]
        while h.router.slots["a"].waiting < 4 or not h.pools:
            await asyncio.sleep(0.01)
        assert h.router.slots["a"].state == "loading" and h.router.slots["a"].stage
        h.gate.set()
        slots = await asyncio.gather(*waiters)
        assert all(s is slots[0] for s in slots) and slots[0].active == 4

    asyncio.run(main())
    assert len(h.pools) == 1 and h.loads == ["a"]


def test_a_waiter_that_leaves_does_not_stop_the_load_for_the_others():
    h = Harness()
    h.gate = threading.Event()

    async def main() -> None:
        first = asyncio.ensure_future(h.router.acquire("a"))
        second = asyncio.ensure_future(h.router.acquire("a"))
        while not h.pools:
            await asyncio.sleep(0.01)
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        h.gate.set()
        slot = await second
        assert slot.state == "ready" and slot.active == 1 and slot.waiting == 0

    asyncio.run(main())
    assert len(h.pools) == 1


def test_least_recently_used_idle_model_is_evicted_when_the_budget_is_full():
    h = Harness(budget_mb=250)  # room for two models of 100 MB

    async def main() -> None:
        await h.use("a")
        await h.use("b")
        await h.use("a")  # a is now more recent than b
        await h.use("c")

    asyncio.run(main())
    assert h.unloads == [("b", "evicted")]
    assert sorted(h.live()) == ["a", "c"]


def test_max_loaded_evicts_even_when_memory_would_hold_more():
    h = Harness(budget_mb=10_000, max_loaded=1)

    async def main() -> None:
        await h.use("a")
        await h.use("b")

    asyncio.run(main())
    assert h.live() == ["b"] and h.unloads == [("a", "evicted")]


def test_a_busy_model_is_never_evicted_the_load_waits_then_503s(monkeypatch):
    monkeypatch.setattr(router_mod, "ROOM_WAIT_S", 0.3)
    h = Harness(budget_mb=150)

    async def main() -> None:
        busy = await h.router.acquire("a")  # held, never released
        with pytest.raises(ApiError) as e:
            await h.router.acquire("b")
        assert e.value.status == 503 and "a are busy" in e.value.message
        h.router.release(busy)
        assert (await h.router.acquire("b")).state == "ready"  # a is idle now: evicted for b

    asyncio.run(main())
    assert h.unloads == [("a", "evicted")]


def test_a_model_that_cannot_fit_even_alone_is_refused_with_numbers_and_never_started():
    h = Harness(budget_mb=250, need_mb={"c": 400})

    async def main() -> None:
        await h.use("a")
        with pytest.raises(ApiError) as e:
            await h.router.acquire("c")
        assert e.value.status == 400 and e.value.code == "model_too_large"
        assert "400 MiB of RAM" in e.value.message and "250 MiB of RAM" in e.value.message

    asyncio.run(main())
    assert [p.model_id for p in h.pools] == ["a"] and h.live() == ["a"]  # nothing evicted for it either


def test_a_failed_load_fails_its_requests_at_once_until_the_file_changes(tmp_path):
    h = Harness()
    h.fail["b"] = "llama.cpp: failed to load model (truncated file)"

    async def main() -> None:
        await h.use("a")
        for _ in range(2):
            with pytest.raises(ApiError) as e:
                await h.router.acquire("b")
            assert e.value.status == 500 and e.value.code == "model_load_failed" and "truncated" in e.value.message
        await h.use("a")

    asyncio.run(main())
    assert [p.model_id for p in h.pools] == ["a", "b"]  # the second request did not start another engine
    assert h.router.slots["b"].state == "failed" and h.router.slots["a"].state == "ready"


def test_idle_models_unload_on_the_fake_clock_and_keep_alive_overrides():
    h = Harness(idle_unload_s=600)

    async def main() -> None:
        await h.use("a")
        await h.use("b", keep_alive=-1)  # forever
        await h.use("c", keep_alive=30)
        h.clock.t += 31
        assert await h.router.reap() == ["c"]
        h.clock.t += 600
        assert await h.router.reap() == ["a"]
        h.clock.t += 10**6
        assert await h.router.reap() == []
        await h.use("a", keep_alive=0)  # Ollama: unload right after
        for _ in range(100):
            if "a" not in h.live():
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert h.live() == ["b"]
    assert h.unloads == [("c", "idle"), ("a", "idle"), ("a", "keep_alive")]


def test_idle_unload_zero_means_never():
    h = Harness(idle_unload_s=0)

    async def main() -> None:
        await h.use("a")
        h.clock.t += 10**9
        assert await h.router.reap() == []
        assert h.router.expires_at_wall(h.router.slots["a"]) is None

    asyncio.run(main())


def test_unload_now_or_after_the_last_request():
    h = Harness()

    async def main() -> None:
        await h.use("a")
        await h.router.unload("a")
        assert h.router.slots["a"].state == "unloaded"
        busy = await h.router.acquire("b")
        await h.router.unload("b")
        assert h.router.slots["b"].state == "ready"
        h.router.release(busy)  # its last request: now it goes
        for _ in range(100):
            if h.router.slots["b"].state == "unloaded":
                break
            await asyncio.sleep(0.01)
        assert h.router.slots["b"].state == "unloaded"

    asyncio.run(main())


def test_names_ids_aliases_and_refusals():
    h = Harness(ids=("smollm2-135m-instruct", "tiny-f32"), aliases={"chat": "smollm2-135m-instruct"})
    r = h.router
    assert r.resolve("tiny-f32") == "tiny-f32" and r.resolve("TINY-F32") == "tiny-f32"
    assert r.resolve("tiny-f32.gguf") == "tiny-f32" and r.resolve("chat") == "smollm2-135m-instruct"
    with pytest.raises(ApiError) as e:
        r.resolve("gpt-4o")
    assert e.value.status == 404 and "smollm2-135m-instruct, tiny-f32" in e.value.message
    for bad in ("../../etc/passwd", "/nowhere/tiny-f32.gguf", "..", "~/x.gguf", "a\\b", "x/../../tiny-f32"):
        with pytest.raises(ApiError) as e:
            r.resolve(bad)
        assert e.value.status == 400 and e.value.code == "invalid_model", bad
    with pytest.raises(KnownError, match="--alias"):
        Router(entries=[ModelEntry(id="a", path="/a.gguf", load=LoadSettings())], pool_factory=lambda e, p: None,
               aliases={"x": "nope"})


def test_one_model_answers_to_any_name():
    h = Harness(ids=("only",))
    assert h.router.resolve("gpt-4o") == "only" == h.router.resolve("../../etc/passwd")


@pytest.mark.parametrize("name,path", [("a.gguf", False), ("hf.co/org/repo:Q4_K_M", False), ("org/repo", False),
                                       ("../a", True), ("/abs/x", True), ("dir/x.gguf", True)])
def test_looks_like_path(name, path):
    assert looks_like_path(name) is path


def test_a_measured_budget_is_taken_while_no_model_is_held():
    seen = []

    def measure() -> Need:
        seen.append(1)
        return Need(1000 * MB, 0)

    b = Budget(measure=measure)
    assert b.capacity(False) == Need(1000 * MB) and b.capacity(True) == Need(1000 * MB)
    assert len(seen) == 1  # kept while models are held
    b.capacity(False)
    assert len(seen) == 2
