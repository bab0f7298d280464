"""Ollama's native API beside /v1 on the same port: /api/chat, /api/generate, /api/tags, /api/show, /api/embed...

Shapes, status codes and the error body ({"error": "..."}) follow Ollama's docs/api.md: NDJSON streams,
durations in nanoseconds, tool calls with arguments as objects. Options that would change the answer
and that we cannot honour (presence/frequency penalties, mirostat, typical_p, a custom template,
images) are refused with a 400 rather than dropped; load-time options (num_gpu, num_thread, ...)
are accepted and ignored, as the server's own settings rule the loaded model.
"""
from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import GENERIC
from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.embeddings import MAX_INPUTS
from ggufdesk.server.errors import ApiError, invalid, not_supported
from ggufdesk.server.http import caller, off_loop, parse_body, service
from ggufdesk.server.images import RequestImages, ollama_content, with_images
from ggufdesk.server.sampling import sampling_from
from ggufdesk.server.schemas import ContextOverflow, Strict
from ggufdesk.server.service import GenSpec, Job, Service, engine_error

API_VERSION = "0.13.5"  # the Ollama API these routes follow (clients check a minimum version)
FOREVER = "2318-01-01T00:00:00Z"  # expires_at of a model that stays loaded (Ollama's keep_alive -1)
# Options that change the answer and that the engine does not have: refused unless at their neutral value.
UNSUPPORTED_OPTIONS = {"presence_penalty": 0, "frequency_penalty": 0, "mirostat": 0, "typical_p": 1,
                       "tfs_z": 1, "penalize_newline": None}
# Options that set how the model is loaded or run, not what it answers: the server's settings rule.
LOAD_OPTIONS = {"num_keep", "num_batch", "num_gpu", "main_gpu", "low_vram", "vocab_only", "use_mmap", "use_mlock",
                "num_thread", "numa", "f16_kv", "logits_all", "embedding_only", "rope_frequency_base",
                "rope_frequency_scale", "mirostat_tau", "mirostat_eta", "num_ctx"}


class Options(Strict):
    """Ollama's runtime options (Modelfile parameters); unknown ones are ignored, as Ollama does."""

    temperature: float | int | None = Field(None, ge=0, le=5)
    top_k: int | None = Field(None, ge=0)
    top_p: float | int | None = Field(None, ge=0, le=1)
    min_p: float | int | None = Field(None, ge=0, le=1)
    repeat_penalty: float | int | None = Field(None, ge=0, le=10)
    repeat_last_n: int | None = Field(None, ge=-1)
    seed: int | None = None
    num_predict: int | None = Field(None, ge=-2)
    num_ctx: int | None = Field(None, ge=1)
    stop: list[str] | str | None = None
    presence_penalty: float | int | None = None
    frequency_penalty: float | int | None = None
    mirostat: int | None = None
    typical_p: float | int | None = None
    tfs_z: float | int | None = None


class ToolFunction(Strict):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ToolCall(Strict):
    function: ToolFunction
    id: str | None = None


class Message(Strict):
    role: str
    content: str | None = ""
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    thinking: str | None = None  # an assistant's earlier reasoning (templates that know it render it)


class Base(Strict):
    model: str = Field(min_length=1)
    stream: bool = True
    options: Options | None = None
    format: str | dict[str, Any] | None = None
    keep_alive: str | int | float | None = None
    think: bool | str | None = None  # a reasoning model: think or not, or how hard ("low"|"medium"|"high")
    context_overflow: ContextOverflow = None  # ours (docs/context.md); Ollama itself cuts silently


class ChatRequest(Base):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Any] | None = None


class GenerateRequest(Base):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: list[Any] | None = None
    context: list[int] | None = None


class EmbedRequest(Strict):
    model: str = Field(min_length=1)
    input: str | list[str] = ""
    truncate: bool = True
    options: Options | None = None
    keep_alive: str | int | float | None = None
    dimensions: int | None = Field(None, ge=1)


class LegacyEmbedRequest(Strict):
    model: str = Field(min_length=1)
    prompt: str = ""
    options: Options | None = None
    keep_alive: str | int | float | None = None


class ModelRequest(Strict):
    model: str | None = None
    name: str | None = None  # older clients' name for it
    verbose: bool = False

    @property
    def which(self) -> str:
        return self.model or self.name or ""


# ---- helpers ------------------------------------------------------------------------------------


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ollama_name(model_id: str) -> str:
    return model_id if ":" in model_id else f"{model_id}:latest"


def sampling_for(svc: Service, opts: Options | None, model: str,
                 overflow: ContextOverflow = None) -> SamplingSettings:
    o = opts or Options.model_validate({})
    for name, neutral in UNSUPPORTED_OPTIONS.items():
        value = getattr(o, name, None)
        if value is not None and neutral is not None and value != neutral:
            raise not_supported(f"options.{name} (this server samples with temperature, top_k, top_p, min_p "
                                "and repeat_penalty)")
    stop = [o.stop] if isinstance(o.stop, str) else list(o.stop or [])
    if len(stop) > 16 or not all(stop):
        raise invalid("options.stop: at most 16 non-empty strings", param="options.stop")
    n = o.num_predict
    max_tokens = None if n is None else (1 << 20) if n < 0 else max(1, n)  # -1: until done, -2: fill the context
    seed = None if o.seed is None else o.seed if 0 <= o.seed < 2**32 else -1  # Ollama: a negative seed is random
    return sampling_from(svc, model, max_tokens=max_tokens, stop=stop, temperature=o.temperature, top_p=o.top_p,
                         top_k=o.top_k, min_p=o.min_p, repeat_penalty=o.repeat_penalty,
                         repeat_last_n=o.repeat_last_n, seed=seed, context_overflow=overflow)


DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)?$")
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: str | int | float | None) -> float | None:
    """Ollama's keep_alive: a number of seconds or a duration ("5m", "1h30m" is not taken: one unit),
    0 = unload now, negative = keep loaded; None = the server's --idle-unload."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = DURATION.match(str(value).strip())
    if m is None:
        raise invalid(f"keep_alive must be a number of seconds or a duration such as \"5m\", not {str(value)[:20]!r}",
                      param="keep_alive")
    return float(m[1]) * UNITS[m[2] or "s"]


async def load_or_unload(svc: Service, model: str, keep_alive: str | int | float | None) -> str:
    """A request with nothing to answer: load the model (keep_alive: how long it stays), or unload it
    (keep_alive 0). Returns Ollama's done_reason."""
    seconds = keep_alive_seconds(keep_alive)
    if seconds == 0:
        await svc.unload_model(model)
        return "unload"
    await svc.load_model(model, seconds)
    return "load"


def format_fields(fmt: str | dict[str, Any] | None) -> dict[str, Any]:
    """Ollama's `format`: "json" (any JSON object) or a JSON schema, as Generate's json_schema."""
    if fmt in (None, ""):
        return {}
    if fmt == "json":
        return {"json_schema": "json_object"}
    if isinstance(fmt, dict):
        return {"json_schema": structured.response_format({"type": "json_schema", "json_schema": {"schema": fmt}})}
    raise invalid(f"format must be \"json\" or a JSON schema, not {str(fmt)[:40]!r}", param="format")


def chat_messages(msgs: list[Message], found: RequestImages | None = None) -> list[dict[str, Any]]:
    """Ollama messages as the engine's: tool calls get ids (arguments as JSON text), a tool result
    answers the oldest call of its name (or in order) that has no answer yet; a user message's
    `images` (base64) become image parts before its text when the route reads images (`found`)."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []  # (call id, function name) not yet answered
    for i, m in enumerate(msgs):
        msg: dict[str, Any] = {"role": m.role, "content": _content(i, m, found)}
        if m.role == "assistant":
            if m.thinking:
                msg["reasoning_content"] = m.thinking
            if m.tool_calls:
                msg["tool_calls"] = _calls(i, m.tool_calls)
                pending += [(c["id"], c["function"]["name"]) for c in msg["tool_calls"]]
        elif m.role == "tool":
            msg["tool_call_id"] = _answered_call(i, m, pending)
        out.append(msg)
    return out


def _content(i: int, m: Message, found: RequestImages | None) -> str | list[dict[str, Any]]:
    """Message i's content, its images as parts before the text where the route reads them (`found`);
    a role Ollama lacks, or images where they cannot go, are refused."""
    if m.role not in ("system", "user", "assistant", "tool"):
        raise invalid(f"messages[{i}].role must be system, user, assistant or tool", param="messages")
    if m.images and (found is None or m.role != "user"):
        raise not_supported(f"messages[{i}].images" + ("" if found is None else " outside a user message"))
    if m.images and found is not None:
        return ollama_content(m.content or "", m.images, f"messages[{i}]", found)
    return m.content or ""


def _answered_call(i: int, m: Message, pending: list[tuple[str, str]]) -> str:
    """The id of the call tool message i answers: its own tool_call_id, else the oldest unanswered call
    of its tool_name (or any), else a made-up one; the call matched is no longer pending."""
    match = next((p for p in pending if m.tool_call_id in (None, p[0]) and m.tool_name in (None, p[1])), None)
    if match is not None:
        pending.remove(match)
    return m.tool_call_id or (match[0] if match else f"call_{i}")


def _calls(i: int, calls: list[ToolCall]) -> list[dict[str, Any]]:
    out = []
    for j, c in enumerate(calls):
        args = c.function.arguments
        out.append({"id": c.id or f"call_{i}_{j}", "type": "function", "function": {
            "name": c.function.name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


def ollama_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(calls):
        fn = c["function"]
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = {}
        out.append({"id": c["id"], "function": {"index": i, "name": fn["name"], "arguments": args}})
    return out


def durations(job: Job, t0: float) -> dict[str, Any]:
    """The final object's counts and nanosecond durations (from the engine's stats where it has them)."""
    total = time.perf_counter() - t0
    st = job.stats
    prompt_s = st.ttft_s if st is not None and st.ttft_s > 0 else (job.ttft_s or 0.0)
    return {"total_duration": int(total * 1e9), "load_duration": 0,
            "prompt_eval_count": job.prompt_tokens, "prompt_eval_duration": int(prompt_s * 1e9),
            "eval_count": job.completion_tokens, "eval_duration": int(max(0.0, total - prompt_s) * 1e9)}


def done_reason(job: Job) -> str:
    return "length" if job.finish_reason == "length" else "stop"


def ndjson(lines: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async for obj in lines:
            yield json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"

    return StreamingResponse(body(), media_type="application/x-ndjson")


def check_model(svc: Service, name: str) -> str:
    try:
        return svc.check_model(name, exact=True)
    except ApiError as e:
        raise ApiError(404, f"model '{name}' not found", code="model_not_found", reason="unknown_model") from e


# ---- chat and generate ----------------------------------------------------------------------------


def chat_spec(svc: Service, req: ChatRequest, model: str, messages: list[dict[str, Any]],
              images: dict[str, str]) -> GenSpec:
    """The generation an /api/chat request asks for, checked (400s); `messages` (with their `images`)
    already read from it by the route."""
    extra = format_fields(req.format)
    tools = structured.openai_tools(req.tools, None, True) if req.tools else {}
    if extra and tools:
        raise invalid("use format or tools, not both", param="format")
    return GenSpec(endpoint="ollama_chat", messages=messages,
                   sampling=sampling_for(svc, req.options, model, req.context_overflow), structured=extra or tools,
                   reasoning=reasoning.openai_fields(think=req.think), model=model, images=images,
                   stream=req.stream)


def generate_spec(svc: Service, req: GenerateRequest, model: str, prompt: str | list[dict[str, Any]],
                  images: dict[str, str]) -> GenSpec:
    """The generation an /api/generate request asks for, checked (400s); `prompt` (the user turn with
    its `images` as parts) already read from it by the route."""
    for name, value in (("suffix", req.suffix), ("template", req.template), ("context", req.context)):
        if value:
            raise not_supported(f"{name} (send the conversation to /api/chat)" if name == "context" else name)
    sampling = sampling_for(svc, req.options, model, req.context_overflow)
    extra = format_fields(req.format)
    think = reasoning.openai_fields(think=req.think)
    if req.raw:
        if images:
            raise not_supported("images with raw (a raw prompt is text)")
        return GenSpec(endpoint="ollama_generate", prompt=(req.system or "") + req.prompt, sampling=sampling,
                       structured=extra, model=model, stream=req.stream)
    msgs = ([{"role": "system", "content": req.system}] if req.system else []) + [
        {"role": "user", "content": prompt}]
    return GenSpec(endpoint="ollama_generate", messages=msgs, sampling=sampling, structured=extra,
                   reasoning=think, model=model, images=images, stream=req.stream)


async def chat(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, ChatRequest, svc.config.max_image_body)
    model = check_model(svc, req.model)
    if not req.messages:  # Ollama's "load the model" (or, with keep_alive 0, "unload it") request
        why = await load_or_unload(svc, model, req.keep_alive)
        return JSONResponse({"model": req.model, "created_at": now_rfc3339(),
                             "message": {"role": "assistant", "content": ""}, "done_reason": why, "done": True})
    messages, images = await with_images(request, model, lambda r, f: chat_messages(r.messages, f), req)
    return await _answer(request, svc, req, await off_loop(chat_spec, svc, req, model, messages, images), chat=True)


async def generate(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, GenerateRequest, svc.config.max_image_body)
    model = check_model(svc, req.model)
    if not req.prompt and not req.system:  # "load the model" (keep_alive 0: "unload it")
        why = await load_or_unload(svc, model, req.keep_alive)
        return JSONResponse({"model": req.model, "created_at": now_rfc3339(), "response": "", "done": True,
                             "done_reason": why})
    prompt, images = await with_images(request, model, lambda r, f: ollama_content(r.prompt, r.images, "", f), req)
    spec = await off_loop(generate_spec, svc, req, model, prompt, images)
    return await _answer(request, svc, req, spec, chat=False)


async def _answer(request: Request, svc: Service, req: ChatRequest | GenerateRequest, spec: GenSpec, *,
                  chat: bool) -> Response:
    t0 = time.perf_counter()
    job = await svc.start(caller(request), spec, request.receive)
    calls = CallStream(svc.pool_for(spec.model).tool_format or GENERIC) if "tools" in spec.structured else None
    if req.stream:
        return ndjson(_stream(job, req.model, t0, chat=chat, calls=calls))
    await job.complete()
    head = {"model": req.model, "created_at": now_rfc3339()}
    text = "".join(job.text)
    if chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if job.done is not None and job.done.tool_calls:
            message = {"role": "assistant", "content": job.done.content or "",
                       "tool_calls": ollama_calls(job.done.tool_calls)}
        if job.reasoning:
            message["thinking"] = "".join(job.reasoning)
        body = {**head, "message": message}
    else:
        body = {**head, "response": text, **({"thinking": "".join(job.reasoning)} if job.reasoning else {})}
    return JSONResponse({**body, "done_reason": done_reason(job), "done": True, **durations(job, t0),
                         **job.context_fields()})


async def _stream(job: Job, name: str, t0: float, *, chat: bool,
                  calls: CallStream | None) -> AsyncIterator[dict[str, Any]]:
    def piece(text: str, thinking: str = "") -> dict[str, Any]:
        head = {"model": name, "created_at": now_rfc3339()}
        more = {"thinking": thinking} if thinking else {}
        if chat:
            return {**head, "message": {"role": "assistant", "content": text, **more}, "done": False}
        return {**head, "response": text, **more, "done": False}

    try:
        async for ev in job.events():
            if job.disconnected:
                return
            if isinstance(ev, P.Token) and ev.reasoning:
                yield piece("", ev.text)
            elif isinstance(ev, P.Token):
                text = calls.push(ev.text) if calls is not None else ev.text
                if text:
                    yield piece(text)
            elif isinstance(ev, P.Done):
                if ev.tool_calls:
                    yield {**piece(""), "message": {"role": "assistant", "content": "",
                                                     "tool_calls": ollama_calls(ev.tool_calls)}}
                elif calls is not None and (rest := calls.finish()):
                    yield piece(rest)
                yield {**piece(""), "done_reason": done_reason(job), "done": True, **durations(job, t0),
                       **job.context_fields()}
            elif isinstance(ev, P.Error):
                yield {"error": engine_error(ev).message}
                return
    finally:
        job.close()


# ---- embeddings -----------------------------------------------------------------------------------


async def embed(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, EmbedRequest)
    model = check_model(svc, req.model)
    inputs: list[str | list[int]] = [req.input] if isinstance(req.input, str) else list(req.input)
    if not inputs or len(inputs) > MAX_INPUTS or not all(inputs):
        raise invalid(f"input must be 1 to {MAX_INPUTS} non-empty texts", param="input")
    pool = svc.pool_for(model)
    if req.dimensions is not None and pool.loaded is not None and req.dimensions != pool.loaded.n_embd:
        raise not_supported(f"dimensions {req.dimensions} (this model's embeddings have {pool.loaded.n_embd})")
    t0 = time.perf_counter()
    ev = await svc.embed(caller(request), model, inputs, truncate=req.truncate, receive=request.receive,
                         endpoint="ollama_embed")
    return JSONResponse({"model": req.model, "embeddings": ev.vectors,
                         "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                         "prompt_eval_count": sum(ev.n_tokens)})


async def embeddings(request: Request) -> Response:
    """The older /api/embeddings: one prompt, one `embedding`."""
    svc = service(request)
    req = await parse_body(request, LegacyEmbedRequest)
    model = check_model(svc, req.model)
    if not req.prompt:
        return JSONResponse({"embedding": []})  # what Ollama answers for an empty prompt
    ev = await svc.embed(caller(request), model, [req.prompt], truncate=True, receive=request.receive,
                         endpoint="ollama_embed")
    return JSONResponse({"embedding": ev.vectors[0]})


# ---- models -------------------------------------------------------------------------------------


def details(m: dict[str, Any]) -> dict[str, Any]:
    family = m["family"]
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family] if family else None,
            "parameter_size": m["parameter_size"], "quantization_level": m["quant"]}


def modified_at(m: dict[str, Any]) -> str:
    return datetime.fromtimestamp(m["modified"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def expires_at(m: dict[str, Any]) -> str:
    """When a loaded model will be unloaded if left idle (Ollama's FOREVER when never)."""
    when = m.get("expires_at")
    if not when:
        return FOREVER
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def version(request: Request) -> Response:
    return JSONResponse({"version": API_VERSION})


async def tags(request: Request) -> Response:
    return JSONResponse({"models": [
        {"name": ollama_name(m["id"]), "model": ollama_name(m["id"]), "modified_at": modified_at(m),
         "size": m["size_bytes"], "digest": m["digest"], "details": details(m)}
        for m in service(request).models()]})


async def ps(request: Request) -> Response:
    models = []
    for m in service(request).models():
        if not m.get("loaded"):
            continue
        mem = m.get("memory") or {}
        size = sum(v for k, v in mem.items() if k != "gpu") or m["size_bytes"]
        models.append({"name": ollama_name(m["id"]), "model": ollama_name(m["id"]), "size": size,
                       "digest": m["digest"], "details": details(m), "expires_at": expires_at(m),
                       "size_vram": int(mem.get("gpu", 0)), "context_length": m.get("n_ctx", 0)})
    return JSONResponse({"models": models})


async def show(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, ModelRequest)
    model = check_model(svc, req.which)
    m = next(x for x in svc.models() if x["id"] == model)
    s = svc.config.sampling
    params = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
              "repeat_penalty": s.repeat_penalty, "num_ctx": m.get("n_ctx") or m["context_length"]}
    parameters = "\n".join(f"{k:<30} {v}" for k, v in params.items())
    template = m.get("chat_template") or ""
    info = {k: v for k, v in m["metadata"].items() if req.verbose or not k.startswith("tokenizer.ggml.")}
    info.setdefault("general.parameter_count", m["n_params"])
    modelfile = (f"# Modelfile generated by ggufdesk\nFROM {m['path']}\n"
                 + (f'TEMPLATE """{template}"""\n' if template else "")
                 + "".join(f"PARAMETER {k} {v}\n" for k, v in params.items()))
    return JSONResponse({"modelfile": modelfile, "parameters": parameters, "template": template,
                         "details": details(m), "model_info": info, "capabilities": m["capabilities"],
                         "modified_at": modified_at(m), "license": ""})


ROUTES = [
    Route("/api/version", version, methods=["GET"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
]
