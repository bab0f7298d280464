"""The service layer between routes and engine: readiness, rate limit, admission, one Job per generation, metrics."""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping, TypeVar

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SamplingSettings, think_value
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineError
from ggufdesk.server.admission import Admission, MemoryGuard
from ggufdesk.server.errors import ApiError
from ggufdesk.server.metrics import Metrics
from ggufdesk.server.metrics_llamacpp import Finished
from ggufdesk.server.pool import EnginePool
from ggufdesk.server.budget import Need
from ggufdesk.server.ratelimit import RateLimiter
from ggufdesk.server.router import Router, Slot

log = logging.getLogger("ggufdesk.server")

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
CLIENT_WINDOW_S = 60.0  # a caller counts as a client for this long after its last request
T = TypeVar("T")
DRAIN_TIMEOUT_S = 30.0  # how long a cancelled request may take to confirm before its slot is freed anyway


@dataclass(kw_only=True)
class ServerConfig:
    """What `ggufdesk serve` was asked for (host and port live with the runner)."""

    api_keys: tuple[str, ...] = ()
    rate_limit: int = 0  # tokens per minute per caller; 0 = off
    parallel: int = 1  # requests generated at once
    max_queue: int = 64  # requests waiting beyond those
    max_body: int = 4 * 1024 * 1024  # bytes
    max_image_body: int = 96 * 1024 * 1024  # bytes of a chat body, which may carry images (server/images.py)
    allow_remote_images: bool = False  # fetch http(s) image URLs (off: only data: URLs and base64)
    default_max_tokens: int = 1024
    # defaults for omitted fields; an API refuses what does not fit unless asked (`context_overflow`)
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(context_overflow="error"))
    metrics: bool = True  # /metrics (off: 501, as llama-server without --metrics)
    slots: bool = False  # /slots (llama-server's --slots)
    tags: tuple[str, ...] = ()  # labels /models lists (llama-server's --tags)
    verbose: bool = False  # every OpenAI answer carries llama-server's `__verbose` (serve --verbose)
    request_timeout: float = 600.0  # seconds one generation may take in the engine (0 = no limit): then a 504
    cors_origins: tuple[str, ...] = ()  # web pages allowed to call the API (CORS); none by default
    read_timeout: float = 30.0  # seconds a request's head and body may take to arrive (server/connections.py)
    max_connections: int = 0  # open connections at most (0: sized from the descriptor limit)


@dataclass(kw_only=True)
class GenSpec:
    """One generation as the routes ask for it."""

    endpoint: str  # "chat" | "completions" | "messages": the metrics label
    sampling: SamplingSettings
    prompt: str | None = None
    prompt_tokens: list[int] | None = None  # a completion prompt given as token ids
    messages: list[dict[str, Any]] | None = None
    logprobs: int = 0
    structured: dict[str, Any] = field(default_factory=dict)  # json_schema or tools/tool_choice/...
    model: str = ""  # the model id (svc.check_model's answer) that start() routes on; "" = the default
    keep_alive: float | None = None  # seconds the model stays loaded after this (Ollama); None = the server's
    reasoning: dict[str, Any] = field(default_factory=dict)  # think / reasoning_budget (server/reasoning.py)
    images: dict[str, str] = field(default_factory=dict)  # sha256 -> base64, for the messages' image parts
    stream: bool = True  # the client reads the tokens as they come (False: the answer goes out whole at its end)


def engine_error(ev: P.Error) -> ApiError:
    """What an engine Error for a request means to an HTTP client."""
    if ev.kind == "context":
        sizes = re.search(r"is (\d+) tokens but the context has room for (\d+)", ev.message)
        extra = {"n_prompt_tokens": int(sizes[1]), "n_ctx": int(sizes[2])} if sizes else {}
        return ApiError(400, ev.message, code="context_length_exceeded", param="messages", reason="context",
                        extra=extra)
    if ev.kind == "overloaded":
        return ApiError(503, ev.message, code="overloaded", retry_after=2, reason="overloaded")
    if ev.kind in ("crash", "hung"):
        return ApiError(503, ev.message, code="engine_restarting", retry_after=5, reason="engine_crash")
    if ev.kind == "settings":
        return ApiError(400, ev.message, reason="invalid")
    if ev.kind == "schema":
        return ApiError(400, ev.message, code="unsupported_schema", reason="invalid")
    if ev.kind == "image":
        return ApiError(400, ev.message, code="invalid_image", param="messages", reason="invalid")
    if ev.kind == "protocol":  # the request could not even be written to the engine (too deep, not JSON)
        return ApiError(400, ev.message, reason="invalid")
    if ev.kind == "timeout":
        return ApiError(504, ev.message, code="timeout", reason="timeout")
    return ApiError(500, ev.message, code=ev.kind, reason="engine_error")


class Service:
    """Everything a route needs; one per server. Runs in one event loop.

    Models come from a Router (many, loaded when asked) or, for the window's server, one EnginePool
    that someone else starts (`pool=`). Routes reach them only through check_model (name -> id),
    pool_for (what a model's engine offers), models() (the listing) and start() (which loads)."""

    def __init__(self, *, pool: EnginePool | None = None, router: Router | None = None, config: ServerConfig,
                 admission: Admission | None = None, limiter: RateLimiter | None = None,
                 metrics: Metrics | None = None) -> None:
        if router is None:
            if pool is None:
                raise ValueError("a Service needs a router or a pool")
            router = Router.single(pool)
        self.router = router
        self.config = config
        gpu = any(s.entry.load.n_gpu_layers != 0 for s in router.slots.values())
        self.admission = admission or Admission(
            slots=config.parallel, max_queue=config.max_queue, memory_check=MemoryGuard(gpu=gpu))
        self.limiter = limiter or RateLimiter(config.rate_limit)
        self.metrics = metrics or Metrics()
        self.metrics.bind(running=lambda: self.admission.running, queued=lambda: self.admission.queued,
                          kv_usage=self.kv_usage)
        self.metrics.bind_models(self._model_metrics)
        router.on_load = self._loaded
        router.on_unload = lambda model_id, why: self.metrics.model_unloads.labels(model_id, why).inc()
        self.created = int(time.time())  # the model's "created" in /v1/models; Process-Start-Time-Unix in /metrics
        self._seen: dict[str, float] = {}
        self._inflight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._serving = threading.Event()

    # ---- facts ----------------------------------------------------------------------------------

    def _loaded(self, model_id: str) -> None:
        self.metrics.model_loads.labels(model_id).inc()
        pool = self.router.slots[model_id].pool
        if pool is not None:
            pool.on_decodes = self.metrics.llamacpp.decoded

    @property
    def pool(self) -> EnginePool | None:
        """The default model's engine (the only one of a single-model server), if loaded."""
        return self.router.slots[self.router.default_id].pool

    @property
    def model_id(self) -> str:
        return self.router.default_id

    def kv_usage(self) -> float:
        used = total = 0
        for slot in self.router.held():
            used += slot.status.get("kv_cells_used", 0)
            total += slot.status.get("kv_cells_total") or 0
        return used / total if total else 0.0

    def clients(self) -> int:
        now = time.monotonic()
        return sum(1 for k, t in self._seen.items() if self._inflight.get(k) or now - t < CLIENT_WINDOW_S)

    def snapshot(self) -> dict[str, Any]:
        """Live counts for the GUI (read from another thread: plain values, no locking needed)."""
        slot = self.router.slots[self.router.default_id]
        loaded = [{"id": s.id, "path": s.entry.path, "state": s.state, "active": s.active,
                   "ram_bytes": (s.need or Need()).ram,
                   "vram_bytes": (s.need or Need()).vram} for s in list(self.router.slots.values())
                  if s.state != "unloaded"]
        return {"state": slot.state, "clients": self.clients(), "running": self.admission.running,
                "queued": self.admission.queued, "kv_usage": self.kv_usage(), "error": slot.error,
                "models": loaded}

    def health(self) -> tuple[int, dict[str, Any]]:
        """/health: a single-model server is ready when its model is (or unloaded: it loads when asked);
        a router is ready when it runs."""
        if len(self.router.slots) > 1:
            return 200, {"status": "ok"}
        slot = self.router.slots[self.router.default_id]
        if slot.state in ("ready", "unloaded", "unloading"):
            return 200, {"status": "ok"}
        if slot.state == "failed":
            return 503, {"status": "error", "error": slot.error}
        return 503, {"status": "loading"}

    def check_model(self, name: str | None, *, exact: bool = False) -> str:
        """The id of the served model a request's `model` names: an id, alias, file stem or
        hf.co/owner/repo:QUANT. With one model served, any name (or none) answers with it, as
        llama-server and LM Studio do; `exact` (Ollama's model-management routes) wants a real name,
        with or without Ollama's ":latest" tag. Raises ApiError: 404 listing the ids, 400 for a path."""
        return self.router.resolve(name or "", exact=exact)

    def pool_for(self, model_id: str) -> Slot:
        """What a model's engine offers the routes: tool_format, loaded, status, logprobs_supported, state."""
        return self.router.slots[model_id]

    def sampling_defaults(self, model_id: str) -> SamplingSettings:
        """The server's sampling defaults (max_tokens: its default) with the model's preset over them."""
        base = dataclasses.replace(self.config.sampling, max_tokens=self.config.default_max_tokens)
        over = self.router.slots[model_id].entry.sampling if model_id in self.router.slots else {}
        return dataclasses.replace(base, **over) if over else base

    def models(self) -> list[dict[str, Any]]:
        """Every servable model with what the listings show (OpenAI, Ollama, `ggufdesk ps`): the header
        facts of server/models.py, then its state here (loaded, n_ctx, memory, expiry, a load's progress)."""
        return [model_facts(self.router, slot) for slot in self.router.slots.values()]

    def _model_metrics(self) -> list[dict[str, Any]]:
        return [{"id": s.id, "state": s.state, "waiting": s.waiting if s.state == "loading" else 0,
                 "loading_s": self.router.loading_seconds(s), "need": s.need if s.pool is not None else None}
                for s in self.router.slots.values()]

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def ensure_background(self) -> None:
        """Start the idle reaper in the running loop (once; again in a new loop), and remember the loop
        for request_load()."""
        loop = asyncio.get_running_loop()
        if self._reaper is None or self._reaper.done() or self._reaper.get_loop() is not loop:
            self._reaper = asyncio.ensure_future(self.router.run())
        self._loop = loop
        self._serving.set()

    def request_load(self, model_id: str, timeout: float = 10.0) -> concurrent.futures.Future[None]:
        """Load a model from another thread (the window's server dock): a future of the load, whose
        refusal is a KnownError (the API's words). Waits up to `timeout` s for the server's loop."""
        if not self._serving.wait(timeout) or self._loop is None:
            raise KnownError("the server is not running")

        async def load() -> None:
            try:
                await self.load_model(model_id)
            except ApiError as e:
                raise KnownError(e.message) from None

        return asyncio.run_coroutine_threadsafe(load(), self._loop)

    def shutdown(self) -> None:
        """Stop every engine (blocking)."""
        self.router.shutdown()

    async def load_model(self, model_id: str, keep_alive: float | None = None) -> None:
        """Load a model without generating (Ollama: a request with no prompt)."""
        await self.router.load(model_id, keep_alive)

    async def unload_model(self, model_id: str) -> None:
        """Unload now, or after its last request (Ollama: keep_alive 0 with no prompt)."""
        await self.router.unload(model_id)

    # ---- one generation ---------------------------------------------------------------------------

    async def start(self, caller: str, spec: GenSpec, receive: Receive) -> Job:
        """Load the model if needed (waiting for its one load), admit and start a generation; returns
        once its first event is known.

        Raises ApiError for refusals (400 never fits, 404, 429, 500 load failed, 503) and for engine
        errors that come first (400 context). A client that goes away while waiting leaves the queue.
        """
        reserved = estimate_prompt_tokens(spec) + spec.sampling.max_tokens
        t0, gone, slot = await self._admit(caller, receive, spec.model, reserve=reserved)
        pool = slot.pool
        assert pool is not None  # _admit checked it is ready
        rid, q = pool.open()
        job = Job(self, rid=rid, queue=q, caller=caller, spec=spec, t0=t0, gone=gone, slot=slot, reserved=reserved)
        self._inflight[caller] = self._inflight.get(caller, 0) + 1
        try:
            images = {"images": spec.images} if spec.images else {}
            await pool.generate(rid, prompt=spec.prompt, messages=with_system(spec.messages, slot),
                                sampling=spec.sampling, logprobs=spec.logprobs, stream=spec.stream,
                                deadline_s=self.config.request_timeout or None, **spec.structured, **spec.reasoning,
                                **images, **({"prompt_tokens": spec.prompt_tokens} if spec.prompt_tokens is not None
                                              else {}))
        except KnownError as e:
            job.finish(None)
            raise ApiError(503, str(e), code="engine_unavailable", retry_after=5, reason="engine_crash") from None
        await job.peek()
        return job

    async def _admit(self, caller: str, receive: Receive, model: str, *,
                     reserve: int) -> tuple[float, asyncio.Future[None], Slot]:
        """The rate limit, the model (loaded if needed, waiting for its one load) and a slot (waiting
        in the queue); returns the start time, a future that completes when the client disconnects,
        and the model in use (released by the caller). A client that goes away while waiting leaves.

        `reserve` tokens are taken from the caller's rate-limit bucket now (server/ratelimit.py) and
        given back if the request is refused here; once admitted, the caller settles them at its end."""
        self.ensure_background()
        model_id = model if model in self.router.slots else self.check_model(model)
        wait = self.limiter.reserve(caller, reserve)
        if wait is not None:
            raise ApiError(429, f"rate limit of {int(self.limiter.capacity)} tokens per minute reached "
                                f"(this request may use {reserve}); try again in {wait} s",
                           code="rate_limit_exceeded", retry_after=wait, reason="rate_limited")
        try:
            return await self._take_slot(caller, receive, model_id)
        except BaseException:
            self.limiter.settle(caller, reserve, 0)  # refused or gone before it started: all of it back
            raise

    async def _take_slot(self, caller: str, receive: Receive,
                         model_id: str) -> tuple[float, asyncio.Future[None], Slot]:
        self._seen[caller] = time.monotonic()
        t0 = time.perf_counter()
        gone = asyncio.ensure_future(_until_disconnect(receive))
        slot = await _unless_gone(gone, self.router.acquire(model_id), self.router.release)
        try:
            await _unless_gone(gone, self.admission.acquire(), lambda _: self.admission.release())
        except BaseException:
            self.router.release(slot)
            raise
        pool = slot.pool
        if pool is None or slot.state != "ready":  # its engine crashed meanwhile and is coming back
            self.admission.release()
            self.router.release(slot)
            gone.cancel()
            raise ApiError(503, slot.error or "the model is loading", code="not_ready", retry_after=5,
                           reason="not_ready")
        return t0, gone, slot

    async def embed(self, caller: str, model: str, inputs: list[str | list[int]], *, truncate: bool,
                    receive: Receive, endpoint: str = "embeddings") -> P.Embeddings:
        """Embeddings of `inputs` by the served model `model` (loaded if needed), admitted like a
        generation (a slot, the rate limit). Raises ApiError (engine refusals: 400; a crash: 503) or ClientGone."""
        reserved = sum(len(x) if isinstance(x, list) else len(x.encode("utf-8", "replace")) // 3 + 1 for x in inputs)
        t0, gone, slot = await self._admit(caller, receive, model, reserve=reserved)
        pool = slot.pool
        assert pool is not None
        rid, q = pool.open()
        self._inflight[caller] = self._inflight.get(caller, 0) + 1
        outcome, n_tokens = "error", 0
        try:
            try:
                await pool.embed(rid, inputs, truncate=truncate)
            except KnownError as e:
                raise ApiError(503, str(e), code="engine_unavailable", retry_after=5, reason="engine_crash") from None
            got = asyncio.ensure_future(q.get())
            either: set[asyncio.Future[Any]] = {got, gone}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not got.done():
                got.cancel()
                outcome = "disconnected"
                await pool.cancel(rid)
                raise ClientGone()
            ev = got.result()
            if isinstance(ev, P.Error):
                err = engine_error(ev)
                outcome = err.reason
                raise err
            if not isinstance(ev, P.Embeddings):  # a Done: the engine cancelled it (it is shutting down)
                raise ApiError(503, "the embedding request was cancelled by the server", code="engine_unavailable",
                               retry_after=5, reason="engine_crash")
            outcome, n_tokens = "ok", sum(ev.n_tokens)
            self.metrics.llamacpp.finished(Finished(prompt_n=n_tokens, prompt_s=time.perf_counter() - t0,
                                                    n_tokens=max(ev.n_tokens, default=0)))
            self.metrics.llamacpp.decoded(ev.n_decode, ev.n_decode)
            return ev
        finally:
            gone.cancel()
            pool.close(rid)
            seconds = time.perf_counter() - t0
            self.admission.release(seconds)
            self.router.release(slot)
            self._done_with(caller)
            self.metrics.latency.labels(endpoint).observe(seconds)
            self.metrics.requests.labels(endpoint, outcome).inc()
            self.metrics.prompt_tokens.inc(n_tokens)
            self.limiter.settle(caller, reserved, n_tokens)

    async def tokenize(self, model: str, **fields: Any) -> P.Tokenized:
        """The served model's Tokenize (text, messages with tools, or token ids back to text). A chat
        prompt is rendered with the request's `think` if it gave one, else the server's (--think and
        the model's preset), as its generation would be."""
        self.ensure_background()
        model_id = model if model in self.router.slots else self.check_model(model)
        if fields.get("messages") is not None and fields.get("think") is None:
            fields["think"] = think_value(self.sampling_defaults(model_id).think)
        slot = await self.router.acquire(model_id)  # loaded if needed; no generation slot: it is quick
        try:
            if slot.pool is None:
                raise ApiError(503, slot.error or "the model is loading", code="not_ready", retry_after=5,
                               reason="not_ready")
            return await slot.pool.tokenize(**fields)
        except EngineError as e:
            raise engine_error(e.event) from None
        except KnownError as e:
            raise ApiError(503, str(e), code="engine_unavailable", retry_after=5, reason="engine_crash") from None
        finally:
            self.router.release(slot)

    def _done_with(self, caller: str) -> None:
        n = self._inflight.get(caller, 1) - 1
        if n > 0:
            self._inflight[caller] = n
        else:
            self._inflight.pop(caller, None)
        self._seen[caller] = time.monotonic()

    def finished(self, job: Job, outcome: str) -> None:
        m, spec = self.metrics, job.spec
        seconds = time.perf_counter() - job.t0
        self.admission.release(seconds)
        job.pool.close(job.rid)
        self.router.release(job.slot, spec.keep_alive)
        self._done_with(job.caller)
        m.latency.labels(spec.endpoint).observe(seconds)
        m.requests.labels(spec.endpoint, outcome).inc()
        if outcome not in ("stop", "length", "tool_calls"):
            m.failures.labels(outcome).inc()
        m.prompt_tokens.inc(job.prompt_tokens)
        m.generated_tokens.inc(job.completion_tokens)
        m.context(job.cached_tokens, job.restored_tokens, job.overflow_policy, job.truncated_tokens)
        if job.stats is not None:
            m.speculation(job.stats.drafted, job.stats.accepted)
        m.llamacpp.finished(job.finished_figures())
        self.limiter.settle(job.caller, job.reserved, job.prompt_tokens + job.completion_tokens)


def estimate_prompt_tokens(spec: GenSpec) -> int:
    """The prompt's tokens before the engine has counted them, for the rate limit's reservation: a third
    of its UTF-8 bytes (tokenizers average 3-4 bytes a token on prose; settled with the real count)."""
    if spec.prompt is not None:
        text = spec.prompt
    else:
        text = "".join(_text(m.get("content")) + str(m.get("tool_calls") or "") for m in spec.messages or [])
    extra = len(str(spec.structured.get("tools") or ""))
    images = sum(1 for m in spec.messages or [] if isinstance(m.get("content"), list)
                 for p in m["content"] if isinstance(p, dict) and p.get("type") == "image")
    return (len(text.encode("utf-8", "replace")) + extra) // 3 + 1 + images * IMAGE_TOKENS_GUESS


IMAGE_TOKENS_GUESS = 256  # an image's tokens before the engine counts them (Gemma 3's; settled with the real count)


def _text(content: Any) -> str:
    """A message's text: a string, or the text of its parts (images are counted apart)."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


def with_system(messages: list[dict[str, Any]] | None, slot: Slot) -> list[dict[str, Any]] | None:
    """The model's preset system prompt first, when the request brings none (as an Ollama Modelfile's)."""
    prompt = slot.entry.system_prompt
    if not prompt or messages is None or any(m.get("role") == "system" for m in messages):
        return messages
    return [{"role": "system", "content": prompt}, *messages]


def model_facts(router: Router, slot: Slot) -> dict[str, Any]:
    from ggufdesk.server.models import describe

    e = slot.entry
    facts = describe(e.path, e.id)
    need = slot.need if slot.pool is not None else None
    loaded = slot.loaded
    facts.update(
        name=e.name or Path(e.path).name, source=e.source, size_bytes=facts["size_bytes"] or e.size,
        state=slot.state, loaded=slot.state == "ready" and loaded is not None,
        n_ctx=loaded.n_ctx if loaded else 0, memory=dict(loaded.memory) if loaded else {},
        expires_at=router.expires_at_wall(slot), ram_bytes=need.ram if need else 0,
        vram_bytes=need.vram if need else 0, active=slot.active, loads=slot.loads, error=slot.error,
        load=({"stage": slot.stage, "elapsed_s": round(router.loading_seconds(slot), 3), "waiting": slot.waiting}
              if slot.state == "loading" else None),
        aliases=sorted(a for a, t in router.aliases.items() if t == e.id))
    if loaded is not None and getattr(loaded, "embedding_only", False):
        facts.update(embedding_only=True, capabilities=["embedding"])
    return facts


async def _unless_gone(gone: asyncio.Future[None], coro: Awaitable[T], undo: Callable[[T], Any]) -> T:
    """`coro`'s result, unless the client leaves first: then ClientGone (and `undo` of a result that
    arrived at the same moment). Its errors are raised as they are."""
    task = asyncio.ensure_future(coro)
    try:
        either: set[asyncio.Future[Any]] = {task, gone}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if gone.done():
        if not task.cancelled() and task.exception() is None:
            undo(task.result())
        raise ClientGone()
    if task.cancelled() or task.exception() is not None:
        gone.cancel()
    return task.result()  # raises its error (or the cancellation)


async def complete_all(jobs: list[Job]) -> None:
    """Several whole answers of one request: collect each, close them all however it ends, raise the
    first engine error as an ApiError."""
    try:
        for job in jobs:
            await job.collect()
    finally:
        for job in jobs:
            job.close()
    for job in jobs:
        if job.error is not None:
            raise engine_error(job.error)


class ClientGone(Exception):
    """The client closed its connection before its request was admitted."""


async def _until_disconnect(receive: Receive) -> None:
    while True:
        msg = await receive()
        if msg.get("type") == "http.disconnect":
            return


class Job:
    """One admitted generation: its events in order, what it produced, and its cleanup.

    Whatever ends it (Done, an engine Error, a disconnect, the response being dropped), the slot is
    released, the caller charged and the metrics recorded exactly once, after the engine confirms.
    """

    def __init__(self, svc: Service, *, rid: str, queue: asyncio.Queue[P.Event], caller: str, spec: GenSpec,
                 t0: float, gone: asyncio.Future[None], slot: Slot, reserved: int = 0) -> None:
        self.svc, self.rid, self.caller, self.spec, self.t0 = svc, rid, caller, spec, t0
        self.reserved = reserved  # rate-limit tokens taken at admission, settled when it ends
        self.slot = slot
        self.pool: EnginePool = slot.pool  # type: ignore[assignment]  # start() checked it is loaded
        self._q = queue
        self._first: Any = None
        self._gone = gone
        self.done: P.Done | None = None
        self.error: P.Error | None = None
        self.stats: P.Stats | None = None
        self.overflow: P.Overflow | None = None  # the latest: what the overflow policy dropped so far
        self.n_tokens = 0
        self.text: list[str] = []  # the answer
        self.reasoning: list[str] = []  # a reasoning model's thinking
        self.logprobs: list[dict[str, Any]] = []
        self.ttft_s: float | None = None
        self.disconnected = False
        self._t_cancel: float | None = None
        self._ended = False
        gone.add_done_callback(self._on_gone)

    # ---- events ---------------------------------------------------------------------------------

    async def peek(self) -> None:
        """Wait for the first event; an engine error that comes first becomes an ApiError."""
        self._first = await self._q.get()
        if isinstance(self._first, P.Error):
            ev, self._first = self._first, None
            self._observe(ev)
            raise engine_error(ev)

    async def events(self) -> AsyncIterator[Any]:
        """Events to the end (Done or Error, included)."""
        while not self._ended:
            if self._first is not None:
                ev, self._first = self._first, None
            else:
                ev = await self._q.get()
            self._observe(ev)
            yield ev

    async def collect(self) -> None:
        async for _ in self.events():
            pass

    async def complete(self) -> None:
        """A whole answer (not streamed): collect it, close the job, raise an engine error as an ApiError."""
        try:
            await self.collect()
        finally:
            self.close()
        if self.error is not None:
            raise engine_error(self.error)

    def _observe(self, ev: Any) -> None:
        if isinstance(ev, P.Token):
            if self.ttft_s is None:
                self.ttft_s = time.perf_counter() - self.t0
                self.svc.metrics.ttft.labels(self.spec.endpoint).observe(self.ttft_s)
            (self.reasoning if getattr(ev, "reasoning", False) else self.text).append(ev.text)
            lp = getattr(ev, "logprobs", None)
            self.n_tokens += len(lp) if lp else 1
            if lp:
                self.logprobs.extend(lp)
        elif isinstance(ev, P.Stats):
            self.stats = ev
        elif isinstance(ev, P.Overflow):
            self.overflow = ev
        elif isinstance(ev, P.Done):
            self.done = ev
            if self._t_cancel is not None and ev.finish_reason == "cancelled":
                self.svc.metrics.cancel.observe(time.perf_counter() - self._t_cancel)
            self.finish("disconnected" if self.disconnected else ev.finish_reason)
        elif isinstance(ev, P.Error):
            self.error = ev
            self.finish(engine_error(ev).reason)

    # ---- outcome --------------------------------------------------------------------------------

    @property
    def prompt_tokens(self) -> int:
        if self.done is not None and "prompt_tokens" in self.done.usage:
            return self.done.usage["prompt_tokens"]
        return self.stats.n_prompt if self.stats else 0

    @property
    def completion_tokens(self) -> int:
        if self.done is not None and "completion_tokens" in self.done.usage:
            return self.done.usage["completion_tokens"]
        return max(self.n_tokens, self.stats.n_gen if self.stats else 0)

    @property
    def finish_reason(self) -> str:
        """OpenAI's words: "stop", "length" (the engine's "context" is a length cut too) or "tool_calls"."""
        reason = self.done.finish_reason if self.done else "stop"
        return "length" if reason in ("length", "context") else "tool_calls" if reason == "tool_calls" else "stop"

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from a cache, memory or disk (OpenAI's prompt_tokens_details.cached_tokens)."""
        if self.done is not None and "cached_tokens" in self.done.usage:
            return self.done.usage["cached_tokens"]
        return self.stats.n_reused if self.stats else 0

    @property
    def restored_tokens(self) -> int:
        """Of the cached tokens, those read from the disk prompt cache."""
        return self.done.usage.get("restored_tokens", 0) if self.done is not None else 0

    @property
    def truncated_tokens(self) -> int:
        """Tokens the overflow policy dropped (prompt tokens left out, tokens shifted out)."""
        if self.done is not None and "truncated_tokens" in self.done.usage:
            return self.done.usage["truncated_tokens"]
        return self.overflow.truncated_tokens if self.overflow is not None else 0

    @property
    def overflow_policy(self) -> str:
        if self.done is not None and self.done.overflow:
            return self.done.overflow
        return self.overflow.policy if self.overflow is not None else ""

    @property
    def reasoning_tokens(self) -> int | None:
        """Tokens spent reasoning (None: the model does not reason)."""
        return self.done.usage.get("reasoning_tokens") if self.done is not None else None

    def usage(self) -> dict[str, Any]:
        p, c = self.prompt_tokens, self.completion_tokens
        out: dict[str, Any] = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
                               "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out

    def timings(self) -> dict[str, Any]:
        """llama-server's `timings`, from the engine's stats (prompt: the part not already cached)."""
        st = self.stats
        if st is None:
            return {"cache_n": 0, "prompt_n": self.prompt_tokens, "prompt_ms": 0.0, "prompt_per_token_ms": 0.0,
                    "prompt_per_second": 0.0, "predicted_n": self.completion_tokens, "predicted_ms": 0.0,
                    "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0}
        prompt_n = max(0, st.n_prompt - st.n_reused)
        prompt_ms = 1000 * prompt_n / st.prefill_tok_s if st.prefill_tok_s > 0 else st.ttft_s * 1000
        n_gen = max(st.n_gen, self.completion_tokens)
        pred_ms = 1000 * max(0, n_gen - 1) / st.decode_tok_s if st.decode_tok_s > 0 else 0.0
        return {"cache_n": st.n_reused, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
                "prompt_per_second": st.prefill_tok_s, "predicted_n": n_gen, "predicted_ms": pred_ms,
                "predicted_per_token_ms": pred_ms / n_gen if n_gen else 0.0, "predicted_per_second": st.decode_tok_s}

    def finished_figures(self) -> Finished:
        """What llama-server's /metrics counts of this request (the same figures as its timings)."""
        t, st = self.timings(), self.stats
        return Finished(prompt_n=t["prompt_n"], cache_n=t["cache_n"], prompt_s=t["prompt_ms"] / 1000,
                        predicted_n=t["predicted_n"], predicted_s=t["predicted_ms"] / 1000,
                        n_tokens=self.prompt_tokens + self.completion_tokens,
                        draft_tokens=st.drafted if st else 0, accepted=st.accepted if st else 0,
                        drafts=st.drafts if st else 0)

    def context_fields(self) -> dict[str, Any]:
        """What a response adds when the overflow policy dropped tokens: their count and the policy."""
        n = self.truncated_tokens
        return {"truncated_tokens": n, "context_overflow": self.overflow_policy} if n else {}

    def finish(self, outcome: str | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._gone.cancel()
        if outcome is not None:
            self.svc.finished(self, outcome)
        else:  # never started in the engine
            self.svc.admission.release()
            self.pool.close(self.rid)
            self.svc.router.release(self.slot)
            self.svc.limiter.settle(self.caller, self.reserved, 0)

    def _on_gone(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled() or self._ended:
            return
        self.disconnected = True
        self._t_cancel = time.perf_counter()
        self.svc.spawn(self.pool.cancel(self.rid))

    def close(self) -> None:
        """The response is over (sent, or dropped by a disconnect): cancel what still runs."""
        if self._ended:
            return
        self.disconnected = True
        self._t_cancel = self._t_cancel or time.perf_counter()
        self.svc.spawn(self._drain())

    async def _drain(self) -> None:
        await self.pool.cancel(self.rid)
        try:
            await asyncio.wait_for(self.collect(), DRAIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("request %s did not confirm its cancel; freeing its slot anyway", self.rid)
            self.finish("disconnected")
