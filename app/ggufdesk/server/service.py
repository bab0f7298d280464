"""The service layer between routes and engine: readiness, rate limit, admission, one Job per generation, metrics."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.server.admission import Admission, MemoryGuard
from ggufdesk.server.errors import ApiError
from ggufdesk.server.metrics import Metrics
from ggufdesk.server.pool import EnginePool
from ggufdesk.server.ratelimit import RateLimiter

log = logging.getLogger("ggufdesk.server")

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
CLIENT_WINDOW_S = 60.0  # a caller counts as a client for this long after its last request
DRAIN_TIMEOUT_S = 30.0  # how long a cancelled request may take to confirm before its slot is freed anyway


@dataclass(kw_only=True)
class ServerConfig:
    """What `ggufdesk serve` was asked for (host and port live with the runner)."""

    api_keys: tuple[str, ...] = ()
    rate_limit: int = 0  # tokens per minute per caller; 0 = off
    parallel: int = 1  # requests generated at once
    max_queue: int = 64  # requests waiting beyond those
    max_body: int = 4 * 1024 * 1024  # bytes
    default_max_tokens: int = 1024
    # defaults for omitted fields; an API refuses what does not fit unless asked (`context_overflow`)
    sampling: SamplingSettings = field(default_factory=lambda: SamplingSettings(context_overflow="error"))
    request_timeout: float = 600.0  # seconds one generation may take in the engine (0 = no limit): then a 504
    cors_origins: tuple[str, ...] = ()  # web pages allowed to call the API (CORS); none by default
    read_timeout: float = 30.0  # seconds a request's head and body may take to arrive (server/connections.py)
    max_connections: int = 0  # open connections at most (0: sized from the descriptor limit)


@dataclass(kw_only=True)
class GenSpec:
    """One generation as the routes ask for it."""

    endpoint: str  # "chat" | "completions" | "messages": the metrics label
    sampling: SamplingSettings
    model: str = ""  # the served model's id (Service.check_model), "" = the only one
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    logprobs: int = 0
    structured: dict[str, Any] = field(default_factory=dict)  # json_schema or tools/tool_choice/...
    reasoning: dict[str, Any] = field(default_factory=dict)  # think / reasoning_budget (server/reasoning.py)


def engine_error(ev: P.Error) -> ApiError:
    """What an engine Error for a request means to an HTTP client."""
    if ev.kind == "context":
        return ApiError(400, ev.message, code="context_length_exceeded", param="messages", reason="context")
    if ev.kind == "overloaded":
        return ApiError(503, ev.message, code="overloaded", retry_after=2, reason="overloaded")
    if ev.kind in ("crash", "hung"):
        return ApiError(503, ev.message, code="engine_restarting", retry_after=5, reason="engine_crash")
    if ev.kind == "settings":
        return ApiError(400, ev.message, reason="invalid")
    if ev.kind == "schema":
        return ApiError(400, ev.message, code="unsupported_schema", reason="invalid")
    if ev.kind == "protocol":  # the request could not even be written to the engine (too deep, not JSON)
        return ApiError(400, ev.message, reason="invalid")
    if ev.kind == "timeout":
        return ApiError(504, ev.message, code="timeout", reason="timeout")
    return ApiError(500, ev.message, code=ev.kind, reason="engine_error")


class Service:
    """Everything a route needs; one per server. Runs in one event loop."""

    def __init__(self, *, pool: EnginePool, config: ServerConfig, admission: Admission | None = None,
                 limiter: RateLimiter | None = None, metrics: Metrics | None = None) -> None:
        self.pool = pool
        self.config = config
        self.admission = admission or Admission(
            slots=config.parallel, max_queue=config.max_queue,
            memory_check=MemoryGuard(gpu=pool.load_settings.n_gpu_layers != 0))
        self.limiter = limiter or RateLimiter(config.rate_limit)
        self.metrics = metrics or Metrics()
        self.metrics.bind(running=lambda: self.admission.running, queued=lambda: self.admission.queued,
                          kv_usage=self.kv_usage)
        self.created = int(time.time())  # the model's "created" in /v1/models
        self._seen: dict[str, float] = {}
        self._inflight: dict[str, int] = {}
        self._tasks: set[asyncio.Task] = set()

    # ---- facts ----------------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self.pool.model_id

    def kv_usage(self) -> float:
        st = self.pool.status
        total = st.get("kv_cells_total") or 0
        return st.get("kv_cells_used", 0) / total if total else 0.0

    def clients(self) -> int:
        now = time.monotonic()
        return sum(1 for k, t in self._seen.items() if self._inflight.get(k) or now - t < CLIENT_WINDOW_S)

    def snapshot(self) -> dict[str, Any]:
        """Live counts for the GUI (read from another thread: plain ints, no locking needed)."""
        state, error = self.pool.health()
        return {"state": state, "clients": self.clients(), "running": self.admission.running,
                "queued": self.admission.queued, "kv_usage": self.kv_usage(), "error": error}

    def require_ready(self) -> None:
        state, error = self.pool.health()
        if state != "ready":
            why = error if state == "failed" else "the model is loading"
            raise ApiError(503, why or "the model is not loaded", code="not_ready", retry_after=5,
                           reason="not_ready")

    def check_model(self, name: str | None, *, exact: bool = False) -> str:
        """The id of the served model a request's `model` names. With one model served, any name (or
        none) answers with it, as llama-server and LM Studio do; `exact` (Ollama's model-management
        routes) wants its id, with or without Ollama's ":latest" tag. Raises a 404 ApiError."""
        if not exact or name in (self.model_id, f"{self.model_id}:latest"):
            return self.model_id
        raise ApiError(404, f"the model {name!r} does not exist; this server has {self.model_id!r}",
                       code="model_not_found", param="model", reason="unknown_model")

    def pool_for(self, model_id: str) -> EnginePool:
        """The engine pool serving `model_id` (its tool format, Loaded event, state)."""
        return self.pool

    def models(self) -> list[dict[str, Any]]:
        """Every model this server can answer with, for the listings (server/models.py's facts plus
        `loaded`, `n_ctx` and, once loaded, `embedding_only` from the engine)."""
        from ggufdesk.server.models import describe

        pool = self.pool
        facts = describe(pool.model, self.model_id)
        loaded = pool.loaded
        facts.update(loaded=pool.state == "ready" and loaded is not None, state=pool.state,
                     n_ctx=loaded.n_ctx if loaded else 0, memory=dict(loaded.memory) if loaded else {})
        if loaded is not None and loaded.embedding_only:
            facts.update(embedding_only=True, capabilities=["embedding"])
        return [facts]

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- one generation ---------------------------------------------------------------------------

    async def start(self, caller: str, spec: GenSpec, receive: Receive) -> Job:
        """Admit and start a generation; returns once its first event is known.

        Raises ApiError for refusals (429, 503) and for engine errors that come first (400 context).
        A client that goes away while queued leaves the queue.
        """
        reserved = estimate_prompt_tokens(spec) + spec.sampling.max_tokens
        t0, gone = await self._admit(caller, receive, reserve=reserved)
        pool = self.pool_for(spec.model or self.model_id)
        rid, q = pool.open()
        job = Job(self, rid=rid, queue=q, caller=caller, spec=spec, t0=t0, gone=gone, pool=pool, reserved=reserved)
        self._inflight[caller] = self._inflight.get(caller, 0) + 1
        try:
            await pool.generate(rid, prompt=spec.prompt, messages=spec.messages, sampling=spec.sampling,
                                logprobs=spec.logprobs, deadline_s=self.config.request_timeout or None,
                                **spec.structured, **spec.reasoning)
        except KnownError as e:
            job.finish(None)
            raise ApiError(503, str(e), code="engine_unavailable", retry_after=5, reason="engine_crash") from None
        await job.peek()
        return job

    async def _admit(self, caller: str, receive: Receive, *, reserve: int) -> tuple[float, asyncio.Future]:
        """Readiness, the rate limit and a slot (waiting in the queue); returns the start time and a
        future that completes when the client disconnects. A client that goes away while queued
        leaves the queue (ClientGone).

        `reserve` tokens are taken from the caller's rate-limit bucket now (server/ratelimit.py) and
        given back if the request is refused here; once admitted, the caller settles them at its end."""
        self.require_ready()
        wait = self.limiter.reserve(caller, reserve)
        if wait is not None:
            raise ApiError(429, f"rate limit of {int(self.limiter.capacity)} tokens per minute reached "
                                f"(this request may use {reserve}); try again in {wait} s",
                           code="rate_limit_exceeded", retry_after=wait, reason="rate_limited")
        try:
            return await self._take_slot(caller, receive)
        except BaseException:
            self.limiter.settle(caller, reserve, 0)  # refused or gone before it started: all of it back
            raise

    async def _take_slot(self, caller: str, receive: Receive) -> tuple[float, asyncio.Future]:
        self._seen[caller] = time.monotonic()
        t0 = time.perf_counter()
        gone = asyncio.ensure_future(_until_disconnect(receive))
        admit = asyncio.ensure_future(self.admission.acquire())
        try:
            await asyncio.wait({admit, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not admit.done():
                admit.cancel()
                await asyncio.gather(admit, return_exceptions=True)
        if gone.done():
            if not admit.cancelled() and admit.exception() is None:
                self.admission.release()
            raise ClientGone()
        if admit.cancelled() or admit.exception() is not None:
            gone.cancel()
            admit.result()  # raises the 503 (or the cancellation)
        return t0, gone

    async def embed(self, caller: str, model: str, inputs: list[str | list[int]], *, truncate: bool,
                    receive: Receive, endpoint: str = "embeddings") -> P.Embeddings:
        """Embeddings of `inputs` by the served model `model`, admitted like a generation (a slot, the
        rate limit). Raises ApiError (engine refusals: 400; a crash: 503) or ClientGone."""
        reserved = sum(len(x) if isinstance(x, list) else len(x.encode("utf-8", "replace")) // 3 + 1 for x in inputs)
        t0, gone = await self._admit(caller, receive, reserve=reserved)
        pool = self.pool_for(model)
        rid, q = pool.open()
        self._inflight[caller] = self._inflight.get(caller, 0) + 1
        outcome, n_tokens = "error", 0
        try:
            try:
                await pool.embed(rid, inputs, truncate=truncate)
            except KnownError as e:
                raise ApiError(503, str(e), code="engine_unavailable", retry_after=5, reason="engine_crash") from None
            got = asyncio.ensure_future(q.get())
            await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
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
            return ev
        finally:
            gone.cancel()
            pool.close(rid)
            seconds = time.perf_counter() - t0
            self.admission.release(seconds)
            self._done_with(caller)
            self.metrics.latency.labels(endpoint).observe(seconds)
            self.metrics.requests.labels(endpoint, outcome).inc()
            self.metrics.prompt_tokens.inc(n_tokens)
            self.limiter.settle(caller, reserved, n_tokens)

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
        self.limiter.settle(job.caller, job.reserved, job.prompt_tokens + job.completion_tokens)


def estimate_prompt_tokens(spec: GenSpec) -> int:
    """The prompt's tokens before the engine has counted them, for the rate limit's reservation: a third
    of its UTF-8 bytes (tokenizers average 3-4 bytes a token on prose; settled with the real count)."""
    if spec.prompt is not None:
        text = spec.prompt
    else:
        text = "".join(str(m.get("content") or "") + str(m.get("tool_calls") or "") for m in spec.messages or [])
    extra = len(str(spec.structured.get("tools") or ""))
    return (len(text.encode("utf-8", "replace")) + extra) // 3 + 1


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

    def __init__(self, svc: Service, *, rid: str, queue: asyncio.Queue, caller: str, spec: GenSpec,
                 t0: float, gone: asyncio.Future, pool: EnginePool | None = None, reserved: int = 0) -> None:
        self.svc, self.rid, self.caller, self.spec, self.t0 = svc, rid, caller, spec, t0
        self.reserved = reserved  # rate-limit tokens taken at admission, settled when it ends
        self.pool = pool or svc.pool  # the engine pool running it
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
            self.svc.limiter.settle(self.caller, self.reserved, 0)

    def _on_gone(self, fut: asyncio.Future) -> None:
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
