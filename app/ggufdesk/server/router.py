"""Many models in one server: an engine process per loaded model, loaded when a request names it, unloaded when idle.

A request for a model that is not loaded starts its load, exactly once however many requests arrive
meanwhile: they all wait on that one load (their client's disconnect only stops their own wait).
Loads run one at a time, so each decides on memory with the others settled. Before a load, the
least recently used idle models are unloaded until the planner's estimate fits the budget (and
`max_loaded`); a model that cannot fit even alone is refused with the numbers (400), never started.
A load that fails (a corrupt file) fails the requests for that model only, and again at once until
its file changes. Idle models are unloaded after `idle_unload_s` (0 = never) or a request's
`keep_alive` (Ollama's: seconds, 0 = right after, negative = never). Used from one event loop.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ggufdesk.core import library
from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.server.budget import Budget, Need, planner_need, too_large
from ggufdesk.server.errors import ApiError
from ggufdesk.server.pool import EnginePool

log = logging.getLogger("ggufdesk.server.router")

ROOM_WAIT_S = 120.0  # how long a load waits for a busy model to go idle before its requests get 503
REAP_EVERY_S = 1.0


@dataclass(kw_only=True)
class ModelEntry:
    """A model the server may serve: its id, its file, and how to load it (the defaults with its preset)."""

    id: str
    path: str
    load: LoadSettings
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    name: str = ""
    size: int = 0
    source: str = "user"
    quant: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # the preset's sampling defaults
    system_prompt: str | None = None  # the preset's, used when a request has none
    file: Callable[[], str] | None = None  # the path to load, made ready (a starter: checked once)

    def resolve_file(self) -> str:
        return self.file() if self.file is not None else self.path


def _file_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class Slot:
    """One servable model: its engine when loaded, who uses or waits for it, and when it expires.

    Offers what the routes read of an engine (tool_format, loaded, status, logprobs_supported)."""

    def __init__(self, entry: ModelEntry, *, now: float) -> None:
        self.entry = entry
        self.pool: EnginePool | None = None
        self.pinned = False  # started by someone else (the window's server): never unloaded by us
        self.active = 0  # requests using it
        self.waiting = 0  # requests waiting for it to load
        self.last_used = now
        self.expires_at: float | None = None  # on the router's clock; None: stays loaded
        self.keep_alive: float | None = None  # the last request's override
        self.unload_when_idle = False  # asked to unload while busy: goes after its last request
        self.need: Need | None = None
        self.load_task: asyncio.Future[None] | None = None
        self.unload_task: asyncio.Future[None] | None = None
        self.load_started: float | None = None
        self.failure: str | None = None
        self.failed_file: tuple[int, int] | None = None
        self.loads = 0
        self._tool_format: Any = None

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def state(self) -> str:
        """unloaded | loading | ready | failed | unloading."""
        if self.unload_task is not None and not self.unload_task.done():
            return "unloading"
        if self.load_task is not None and not self.load_task.done():
            return "loading"
        if self.pool is not None:
            return {"ready": "ready", "failed": "failed"}.get(self._health()[0], "loading")
        return "failed" if self.failure else "unloaded"

    @property
    def error(self) -> str | None:
        return self._health()[1] if self.pool is not None else self.failure

    def _health(self) -> tuple[str, str | None]:
        """The engine's (state, error), counting a client that lost a thread as failed (EnginePool.health)."""
        pool = self.pool
        health = getattr(pool, "health", None)
        return health() if callable(health) else (getattr(pool, "state", ""), getattr(pool, "error", None))

    @property
    def idle(self) -> bool:
        return self.active == 0 and self.waiting == 0 and self.pool is not None and self.state in ("ready", "failed")

    @property
    def stage(self) -> str:
        """What a load in progress is doing: queued, starting (the process), model, draft."""
        if self.state != "loading":
            return ""
        if self.pool is None:
            return "queued"
        return getattr(self.pool, "stage", "") or "starting"

    # ---- what the routes read of the engine -----------------------------------------------------

    @property
    def tool_format(self) -> Any:
        if self.pool is not None and self.pool.tool_format is not None:
            return self.pool.tool_format
        if self._tool_format is None:
            from ggufdesk.core.tools import model_format

            self._tool_format = model_format(self.entry.path)
        return self._tool_format

    @property
    def loaded(self) -> Any:
        return self.pool.loaded if self.pool is not None else None

    @property
    def status(self) -> dict[str, Any]:
        return self.pool.status if self.pool is not None else {}

    @property
    def logprobs_supported(self) -> bool:
        return self.pool.logprobs_supported if self.pool is not None else True


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def looks_like_path(name: str) -> bool:
    """A name that could only mean a file: the API takes library ids and names, never paths."""
    return (name.startswith(("/", "~", ".")) or ".." in name or "\\" in name or "\0" in name
            or (("/" in name) and name.lower().endswith(".gguf")))


class Router:
    """The servable models by id, and which of them are loaded (see the module docstring)."""

    def __init__(self, *, entries: list[ModelEntry], pool_factory: Callable[[ModelEntry, str], EnginePool],
                 idle_unload_s: float = 600.0, max_loaded: int = 0, budget: Budget | None = None,
                 need: Callable[[str, ModelEntry], Need] | None = None, aliases: dict[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not entries:
            raise KnownError("no models to serve: pass a model path or library id, or add models to the "
                             "library (`ggufdesk library`)")
        if idle_unload_s < 0 or max_loaded < 0:
            raise KnownError("--idle-unload and --max-loaded cannot be negative")
        self.clock, self.wall = clock, wall
        self.slots: dict[str, Slot] = {}
        for e in entries:
            if e.id in self.slots:
                raise KnownError(f"two models have the id {e.id!r}")
            self.slots[e.id] = Slot(e, now=clock())
        self._library = [library.LocalModel(Path(e.path), e.name or Path(e.path).name, e.size, e.source, e.quant,
                                            id=e.id) for e in entries]
        self.aliases: dict[str, str] = {}
        for name, target in (aliases or {}).items():
            self.aliases[name] = self._known(target)
        self.pool_factory = pool_factory
        self.idle_unload_s = idle_unload_s
        self.max_loaded = max_loaded
        self.budget = budget or Budget()
        self._need = need or (lambda path, e: planner_need(path, e.load, e.speculation))
        self._lock: asyncio.Lock | None = None
        self._changed: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self.on_load: Callable[[str], None] = lambda model_id: None
        self.on_unload: Callable[[str, str], None] = lambda model_id, why: None

    @classmethod
    def single(cls, pool: EnginePool) -> Router:
        """One model whose engine someone else starts (the window's server): pinned, never unloaded."""
        entry = ModelEntry(id=pool.model_id, path=pool.model, load=pool.load_settings,
                           speculation=pool.speculation)
        router = cls(entries=[entry], pool_factory=lambda e, path: pool, idle_unload_s=0)
        slot = router.slots[entry.id]
        slot.pool, slot.pinned = pool, True
        return router

    # ---- names ----------------------------------------------------------------------------------

    @property
    def ids(self) -> list[str]:
        return list(self.slots)

    @property
    def default_id(self) -> str:
        return next(iter(self.slots))

    def _known(self, target: str) -> str:
        hit = self.slots.get(target) or self.slots.get(getattr(library.find(target, self._library), "id", ""))
        if hit is None:
            raise KnownError(f"--alias: {target!r} is not one of the served models ({', '.join(self.slots)})")
        return hit.id

    def resolve(self, name: str, *, exact: bool = False) -> str:
        """The id a request's model name means. With one model served, any name means it (as
        llama-server and LM Studio do) unless `exact`; otherwise an id, alias, file stem or
        hf.co/owner/repo:QUANT (`exact` also takes Ollama's ":latest" after an id or alias)."""
        if exact and name.endswith(":latest") and name[:-7] in (*self.slots, *self.aliases):
            name = name[:-7]
        if name in self.slots:
            return name
        if name in self.aliases:
            return self.aliases[name]
        if len(self.slots) == 1 and not exact:
            return self.default_id
        hit = library.find(name, self._library) if name and not looks_like_path(name) else None
        if hit is not None:
            return hit.id
        if looks_like_path(name):
            raise ApiError(400, f"the model {name!r} is refused: models are named by their library id "
                                f"(one of {', '.join(self.slots)}), never by a file path",
                           code="invalid_model", param="model", reason="invalid")
        raise ApiError(404, f"the model {name!r} does not exist; this server has: {', '.join(self.slots)}",
                       code="model_not_found", param="model", reason="unknown_model")

    # ---- using a model ----------------------------------------------------------------------------

    async def acquire(self, model_id: str) -> Slot:
        """The model, loaded, and counted as in use until release(). Waits for its one load (started
        here if needed); raises ApiError for a refusal (400 never fits, 500 load failed, 503 busy)."""
        slot = self.slots[model_id]
        slot.waiting += 1
        try:
            while True:
                state = slot.state
                if state == "ready":
                    slot.active += 1
                    slot.last_used = self.clock()
                    return slot
                await self._settle(slot, state)
        finally:
            slot.waiting -= 1

    async def _settle(self, slot: Slot, state: str) -> None:
        """Move a slot that is not ready on: wait for its load or unload, start a load, or refuse."""
        loading_here = slot.load_task is not None and not slot.load_task.done()
        if state == "unloading":
            assert slot.unload_task is not None
            await asyncio.shield(slot.unload_task)
        elif loading_here:
            assert slot.load_task is not None
            await asyncio.shield(slot.load_task)
        elif state == "loading" or slot.pinned:
            # an engine restarting after a crash, or a pinned one that someone else loads
            why = slot.error if state == "failed" else "the model is loading"
            raise ApiError(503, why or "the model is not loaded", code="not_ready", retry_after=5, reason="not_ready")
        elif state == "failed" and slot.pool is not None:  # its engine died and could not come back
            await self._unload(slot, "failed")
        else:  # unloaded, or failed to load
            if slot.failure and slot.failed_file == _file_key(slot.entry.path):
                raise self._load_failed(slot)
            slot.failure = None
            task = slot.load_task = asyncio.ensure_future(self._load(slot))
            task.add_done_callback(_retrieved)  # nobody may be left to read its error
            await asyncio.shield(task)

    def release(self, slot: Slot, keep_alive: float | None = None) -> None:
        """A request is done with the model; `keep_alive` (seconds; negative = forever) overrides the
        idle time after it, as Ollama's does."""
        slot.active = max(0, slot.active - 1)
        slot.last_used = self.clock()
        slot.keep_alive = 0 if slot.unload_when_idle else keep_alive
        slot.expires_at = self._expiry(slot)
        if slot.idle:
            self._notify()
            if slot.expires_at is not None and slot.expires_at <= self.clock():
                self.spawn(self._unload(slot, "keep_alive"))

    def _expiry(self, slot: Slot) -> float | None:
        if slot.pinned:
            return None
        if slot.keep_alive is not None:
            return None if slot.keep_alive < 0 else slot.last_used + slot.keep_alive
        return None if self.idle_unload_s == 0 else slot.last_used + self.idle_unload_s

    async def load(self, model_id: str, keep_alive: float | None = None) -> Slot:
        """Load without generating (Ollama's empty prompt), then start the idle clock."""
        slot = await self.acquire(model_id)
        self.release(slot, keep_alive)
        return slot

    async def unload(self, model_id: str) -> None:
        """Unload now if idle; if busy, right after its last request (Ollama's keep_alive 0)."""
        slot = self.slots[model_id]
        if slot.pinned or slot.pool is None:
            return
        if slot.idle:
            await self._unload(slot, "requested")
        else:
            slot.unload_when_idle = True

    async def reap(self) -> list[str]:
        """Unload the idle models whose time is up; their ids."""
        now = self.clock()
        due = [s for s in self.slots.values()
               if s.idle and not s.pinned and s.expires_at is not None and s.expires_at <= now]
        for s in due:
            await self._unload(s, "idle")
        return [s.id for s in due]

    async def run(self, every_s: float = REAP_EVERY_S) -> None:
        """The idle reaper: runs until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.reap()
            except Exception:  # the reaper must outlive one bad unload
                log.exception("idle unload failed")

    # ---- loading and unloading --------------------------------------------------------------------

    def _sync(self) -> tuple[asyncio.Lock, asyncio.Event]:
        if self._lock is None or self._changed is None:  # made in the loop that uses them
            self._lock, self._changed = asyncio.Lock(), asyncio.Event()
        return self._lock, self._changed

    def _notify(self) -> None:
        self._sync()[1].set()

    def _load_failed(self, slot: Slot) -> ApiError:
        return ApiError(500, f"the model {slot.id!r} failed to load: {slot.failure}", code="model_load_failed",
                        param="model", reason="load_failed")

    def _fail(self, slot: Slot, why: str) -> ApiError:
        slot.failure, slot.failed_file = why, _file_key(slot.entry.path)
        log.warning("model %s failed to load: %s", slot.id, why)
        return self._load_failed(slot)

    async def _load(self, slot: Slot) -> None:
        lock, _ = self._sync()
        async with lock:  # one load at a time
            try:
                path = await asyncio.to_thread(slot.entry.resolve_file)
                need = slot.need if slot.need is not None else await asyncio.to_thread(self._need, path, slot.entry)
            except KnownError as e:
                raise self._fail(slot, str(e)) from None
            slot.need = need
            capacity = self.budget.capacity(bool(self.held()))
            if not need.within(capacity):
                raise ApiError(400, too_large(slot.id, path, slot.entry.load.n_ctx, need, capacity),
                               code="model_too_large", param="model", reason="too_large")
            await self._make_room(slot, need, capacity)
            slot.load_started = self.clock()
            pool = slot.pool = self.pool_factory(slot.entry, path)
            try:
                await asyncio.to_thread(pool.start)
            except KnownError as e:
                slot.pool = None
                await asyncio.to_thread(pool.shutdown)
                raise self._fail(slot, str(e)) from None
            except BaseException:
                slot.pool = None
                await asyncio.to_thread(pool.shutdown)
                raise
            slot.loads += 1
            slot.last_used = self.clock()
            slot.keep_alive = None
            slot.expires_at = self._expiry(slot)
            self.on_load(slot.id)
            log.info("loaded %s in %.1f s", slot.id, self.clock() - slot.load_started)

    def held(self, but: Slot | None = None) -> list[Slot]:
        return [s for s in self.slots.values() if s.pool is not None and s is not but]

    async def _make_room(self, slot: Slot, need: Need, capacity: Need) -> None:
        """Unload the least recently used idle models until `need` fits beside the rest."""
        _, changed = self._sync()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ROOM_WAIT_S
        while True:
            held = self.held(but=slot)
            used = sum((s.need or Need() for s in held), Need())
            if (not self.max_loaded or len(held) < self.max_loaded) and (used + need).within(capacity):
                return
            idle = [s for s in held if s.idle and not s.pinned]
            if idle:
                await self._unload(min(idle, key=lambda s: s.last_used), "evicted", f"to make room for {slot.id}")
                continue
            left = deadline - loop.time()
            if left <= 0:
                busy = ", ".join(s.id for s in held)
                raise ApiError(503, f"no room to load {slot.id!r} while {busy} are busy; try again shortly",
                               code="overloaded", retry_after=5, reason="no_room")
            changed.clear()
            try:  # wake when a model goes idle (and look again at least every second)
                await asyncio.wait_for(changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    async def _unload(self, slot: Slot, why: str, detail: str = "") -> None:
        """Stop its engine; `why` is the metrics label: idle, evicted, requested, keep_alive, failed."""
        if slot.unload_task is not None and not slot.unload_task.done():
            await asyncio.shield(slot.unload_task)
            return
        pool = slot.pool
        if pool is None:
            return

        async def stop() -> None:
            try:
                await asyncio.to_thread(pool.shutdown)
            finally:
                slot.pool = None
                slot.expires_at, slot.unload_when_idle = None, False
                log.info("unloaded %s (%s%s)", slot.id, why, f" {detail}" if detail else "")
                self.on_unload(slot.id, why)
                self._notify()

        slot.unload_task = asyncio.ensure_future(stop())
        await asyncio.shield(slot.unload_task)

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def shutdown(self) -> None:
        """Stop every engine (blocking; from any thread, after the loop has stopped serving)."""
        for slot in self.slots.values():
            pool, slot.pool = slot.pool, None
            if pool is not None:
                pool.shutdown()

    # ---- facts ------------------------------------------------------------------------------------

    def expires_at_wall(self, slot: Slot) -> float | None:
        if slot.expires_at is None or slot.pool is None:
            return None
        return self.wall() + (slot.expires_at - self.clock())

    def loading_seconds(self, slot: Slot) -> float:
        return self.clock() - slot.load_started if slot.state == "loading" and slot.load_started else 0.0
