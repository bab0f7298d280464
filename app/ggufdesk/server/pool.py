"""The server's engine: one EngineClient whose events are routed by request id to per-request asyncio queues."""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from typing import Any, Callable

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.api import ClientFactory, EngineAPI

log = logging.getLogger("ggufdesk.server.pool")


def default_client(**kwargs: Any) -> EngineAPI:
    from ggufdesk.engine.link.client import EngineClient

    return EngineClient(**kwargs)


class EnginePool:
    """Loads one model in one engine process and multiplexes many generations over it.

    `state` is "starting", "loading", "ready" or "failed" (`error` says why). After an engine crash
    the client restarts it and reloads the model: the state goes back to "loading", then "ready".
    Events for a request id go to the queue opened for it; events for closed ids are dropped.
    """

    def __init__(self, *, model: str, load: LoadSettings, speculation: SpeculationSettings | None = None,
                 client_factory: ClientFactory = default_client, model_id: str | None = None) -> None:
        self.model = model
        self.model_id = model_id or os.path.splitext(os.path.basename(model))[0]
        self.load_settings = load
        self.speculation = speculation or SpeculationSettings()
        self.state = "starting"
        self.error: str | None = None
        self.loaded: P.Loaded | None = None
        self.status: dict[str, Any] = {}  # the engine's latest Status event, when it sends them
        self.stage = ""  # while loading: "starting" (the process), then the engine's Loading stage
        self.tool_format: Any = None  # core.tools.ToolFormat the engine uses for this model's calls
        self._client: EngineAPI = client_factory(on_event=self._on_event)
        self._routes: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[P.Event]]] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self.logprobs_supported = self._client.supports_logprobs
        self.on_state: Callable[[str], None] | None = None  # called on a worker thread
        # the engine's decode calls and the sequences they served since the last Status (on the reader thread)
        self.on_decodes: Callable[[int, int], None] | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the engine and load the model (blocking: run it on a thread). Raises KnownError."""
        self.stage = "starting"
        self._set_state("loading")
        from ggufdesk.core.tools import model_format

        self.tool_format = model_format(self.model, self.load_settings.chat_template)
        try:
            self._client.start()
            self._client.load(self.model, settings=self.load_settings, speculation=self.speculation)
        except KnownError as e:
            self.error = str(e)
            self._set_state("failed")
            raise
        self._set_state("ready")

    def shutdown(self) -> None:
        self._client.shutdown()
        with self._lock:
            routes = list(self._routes.items())
        for rid, _ in routes:  # nobody is left to answer them
            self._route(P.Error(kind="crash", id=rid, message="the server is shutting down"))

    def _set_state(self, state: str) -> None:
        self.state = state
        if state == "ready":
            self.error = None
            self._ready.set()
        if self.on_state is not None:
            try:
                self.on_state(state)
            except Exception:
                log.exception("state listener failed")

    def health(self) -> tuple[str, str | None]:
        """(state, error) as /health tells them: a client that lost a thread is failed even before
        any event says so (issue 34: /health said ok while every request got 503)."""
        why = self._client.problem()
        if why:
            return "failed", why
        return self.state, self.error

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    @property
    def engine_pid(self) -> int | None:
        return self._client.pid

    # ---- requests -----------------------------------------------------------------------------

    def open(self) -> tuple[str, asyncio.Queue[P.Event]]:
        """A fresh request id and the queue its events will arrive on (in the calling loop)."""
        rid = f"srv{next(self._ids)}"
        q: asyncio.Queue[P.Event] = asyncio.Queue()
        with self._lock:
            self._routes[rid] = (asyncio.get_running_loop(), q)
        return rid, q

    def close(self, rid: str) -> None:
        with self._lock:
            self._routes.pop(rid, None)

    async def generate(self, rid: str, *, prompt: str | None = None, messages: list[dict[str, Any]] | None = None,
                       sampling: SamplingSettings, logprobs: int = 0, **structured: Any) -> None:
        kwargs: dict[str, Any] = dict(structured)
        if logprobs:
            kwargs["logprobs"] = logprobs
        await asyncio.to_thread(self._client.generate, prompt=prompt, messages=messages, sampling=sampling,
                                request_id=rid, **kwargs)

    async def embed(self, rid: str, inputs: list[str | list[int]], *, truncate: bool = False) -> None:
        """Ask for embeddings under `rid` (opened with open()): its Embeddings or Error event follows."""
        await asyncio.to_thread(self._client.start_embed, inputs, truncate=truncate, request_id=rid)

    async def tokenize(self, **fields: Any) -> P.Tokenized:
        """The engine's Tokenized answer (client.tokenize's fields); raises EngineError or KnownError."""
        result: P.Tokenized = await asyncio.to_thread(self._client.tokenize, **fields)
        return result

    async def cancel(self, rid: str) -> None:
        try:
            await asyncio.to_thread(self._client.cancel, rid)
        except KnownError as e:
            log.info("cancel %s: %s", rid, e)

    # ---- events (engine reader thread) ----------------------------------------------------------

    def _on_event(self, event: P.Event) -> None:
        if isinstance(event, P.Loaded):
            self.loaded = event
            self.stage = ""
            self._set_state("ready")
        elif isinstance(event, P.Loading):
            self.stage = event.stage
        elif isinstance(event, P.Status):
            self._decodes(event)
            self.status = P.fields_of(event)
        elif isinstance(event, P.Lifecycle):
            self._lifecycle(event)
        elif getattr(event, "id", None) is not None:
            self._route(event)
        elif isinstance(event, P.Error):
            log.warning("engine: %s", event.message)

    def _decodes(self, ev: P.Status) -> None:
        """Tell on_decodes what the engine decoded since its last Status (its counts start again at 0
        when the engine restarts)."""
        n, busy = self.status.get("n_decode", 0), self.status.get("n_busy", 0)
        if ev.n_decode < n or ev.n_busy < busy:
            n = busy = 0
        if self.on_decodes is not None and ev.n_decode > n:
            self.on_decodes(ev.n_decode - n, ev.n_busy - busy)

    def _lifecycle(self, ev: P.Lifecycle) -> None:
        """The client's account of the engine process: a crash or hang restarts it and reloads."""
        if ev.state == "loaded":
            self._set_state("ready")
        elif ev.state in ("starting", "loading"):
            self.loaded = None
            self.error = ev.reason or None
            self._set_state("loading")
        elif ev.state == "failed" or (ev.state == "ready" and ev.reason and self.state != "starting"):
            self.loaded = None  # it cannot run, or it restarted without the model
            self.error = ev.reason or "the engine stopped"
            self._set_state("failed")

    def _route(self, event: P.Event) -> None:
        rid = getattr(event, "id", None)  # Ready, Status and Lifecycle have none
        with self._lock:
            route = self._routes.get(rid) if isinstance(rid, str) else None
        if route is None:
            return
        loop, q = route
        try:
            loop.call_soon_threadsafe(q.put_nowait, event)
        except RuntimeError:  # the loop has closed
            pass
