"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions (streaming and not)."""
from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import GENERIC
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.errors import ApiError, invalid, not_supported
from ggufdesk.server.http import caller, event_stream, off_loop, parse_body, service, sse
from ggufdesk.server.images import RequestImages, with_images
from ggufdesk.server.schemas import ChatRequest, CompletionRequest, SamplingFields, refuse_unsupported, stops, text_of
from ggufdesk.server.service import GenSpec, Job, Service, engine_error

def sampling_for(svc: Service, req: SamplingFields, max_tokens: int | None, model: str) -> SamplingSettings:
    d = svc.sampling_defaults(model)

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    try:
        return SamplingSettings(
            temperature=pick(req.temperature, d.temperature), top_p=pick(req.top_p, d.top_p),
            top_k=pick(req.top_k, d.top_k), min_p=pick(req.min_p, d.min_p),
            repeat_penalty=pick(req.repeat_penalty, d.repeat_penalty), repeat_last_n=d.repeat_last_n,
            seed=pick(req.seed, d.seed), max_tokens=max_tokens or d.max_tokens,
            stop=stops(req.stop) or list(d.stop), think=d.think, reasoning_budget=d.reasoning_budget,
            context_overflow=pick(req.context_overflow, d.context_overflow),
        )
    except SettingsError as e:
        raise invalid(str(e)) from None


def want_logprobs(svc: Service, model: str, n: int) -> int:
    """top-N for the engine (N >= 1 so the chosen token's own logprob comes back)."""
    if not svc.pool_for(model).logprobs_supported:
        raise not_supported("logprobs (needs the batched engine)")
    return max(1, n)


def chat_messages(req: ChatRequest, images: RequestImages | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        if m.role == "function":
            raise not_supported(f"messages[{i}] with role 'function' (use tools and role 'tool')")
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                               "content": content_of(m.content, f"messages[{i}]", images)}
        if m.tool_calls:
            msg["tool_calls"] = m.tool_calls
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.reasoning_content and m.role == "assistant":
            msg["reasoning_content"] = m.reasoning_content
        out.append(msg)
    return out


def content_of(content: Any, where: str, images: RequestImages | None) -> str | list[dict[str, Any]]:
    """A message's content: text, or (with image_url parts) the engine's parts."""
    if images is None or not isinstance(content, list) or not any(p.type == "image_url" for p in content):
        return text_of(content, where)
    parts: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        if p.type == "image_url":
            ref = getattr(p, "image_url", None)
            url = ref.get("url") if isinstance(ref, dict) else ref
            parts.append(images.part_from_url(url, f"{where}.content[{j}].image_url"))
        elif p.type == "text" and p.text is not None:
            parts.append({"type": "text", "text": p.text})
        else:
            raise not_supported(f"{where} content of type {p.type!r}")
    return parts


def chat_structured(req: ChatRequest) -> dict[str, Any]:
    schema = structured.response_format(req.response_format)
    tools = structured.openai_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    if schema is not None and tools:
        raise invalid("use response_format or tools, not both", param="response_format")
    return {"json_schema": schema} if schema is not None else tools


def openai_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": c["id"], "type": "function", "function": c["function"]} for c in calls]


# ---- logprobs in OpenAI's two shapes --------------------------------------------------------------


def chat_logprobs(items: list[dict[str, Any]], top: int) -> dict[str, Any]:
    def one(t: dict[str, Any]) -> dict[str, Any]:
        return {"token": t["token"], "logprob": t["logprob"], "bytes": list(t["token"].encode("utf-8"))}

    return {"content": [{**one(t), "top_logprobs": [one(x) for x in (t.get("top") or [])[:top]]}
                        for t in items]}


def completion_logprobs(items: list[dict[str, Any]], top: int, offset: int) -> dict[str, Any]:
    offsets = []
    for t in items:
        offsets.append(offset)
        offset += len(t["token"])
    return {"tokens": [t["token"] for t in items], "token_logprobs": [t["logprob"] for t in items],
            "top_logprobs": [{x["token"]: x["logprob"] for x in (t.get("top") or [])[:top]} for t in items],
            "text_offset": offsets}


# ---- routes -----------------------------------------------------------------------------------


LISTING_SKIPS = ("id", "metadata", "chat_template")  # /api/show's business: kilobytes per model


async def models(request: Request) -> Response:
    """Every servable model; beside OpenAI's fields, llama-server's router `status` and ours (loaded,
    memory, expiry: what `ggufdesk ps` shows)."""
    svc = service(request)
    return JSONResponse({"object": "list", "data": [
        {"id": m["id"], "object": "model", "created": svc.created, "owned_by": "ggufdesk",
         "status": {"value": m["state"]}, **{k: v for k, v in m.items() if k not in LISTING_SKIPS}}
        for m in svc.models()]})


async def chat_completions(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, ChatRequest, svc.config.max_image_body)
    refuse_unsupported(req)
    extra = await off_loop(chat_structured, req)
    model = svc.check_model(req.model)
    messages, images = await with_images(request, model, chat_messages, req)
    top = req.top_logprobs or 0
    lp = want_logprobs(svc, model, top) if req.logprobs else 0
    sampling = sampling_for(svc, req, req.max_completion_tokens or req.max_tokens, model)
    think = reasoning.openai_fields(effort=req.reasoning_effort, template_kwargs=req.chat_template_kwargs,
                                    budget=req.reasoning_budget, think=req.think)
    spec = GenSpec(endpoint="chat", messages=messages, sampling=sampling, logprobs=lp, structured=extra,
                   reasoning=think, model=model, images=images)
    job = await svc.start(caller(request), spec, request.receive)
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        calls = CallStream(job.pool.tool_format or GENERIC) if "tools" in extra else None
        return event_stream(_chat_stream(job, cid, created, model, top if lp else None, usage, calls))
    try:
        await job.collect()
    finally:
        job.close()
    if job.error is not None:
        raise _mid_error(job)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(job.text)}
    if job.done is not None and job.done.tool_calls:
        message = {"role": "assistant", "content": job.done.content or None,
                   "tool_calls": openai_calls(job.done.tool_calls)}
    if job.reasoning:  # as llama-server and DeepSeek: the thinking beside the answer
        message["reasoning_content"] = "".join(job.reasoning)
    choice = {"index": 0, "message": message, "logprobs": chat_logprobs(job.logprobs, top) if lp else None,
              "finish_reason": job.finish_reason}
    return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": model,
                         "choices": [choice], "usage": job.usage(), "system_fingerprint": None,
                         **job.context_fields()})


def _chat_stream(job: Job, cid: str, created: int, model: str, top: int | None,
                 include_usage: bool, calls: CallStream | None) -> AsyncIterator[str]:
    """Chunks as tokens come; with tools, text that may be a call is held back and calls come at the end."""
    head = _chunk_head(cid, "chat.completion.chunk", created, model)

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        extra = job.context_fields() if finish else {}
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                    **extra})

    def lines(ev: P.Event) -> Iterator[str]:
        if isinstance(ev, P.Token):
            lps = getattr(ev, "logprobs", None)
            lp = chat_logprobs(lps, top) if top is not None and lps else None
            if ev.reasoning:
                yield chunk({"reasoning_content": ev.text}, logprobs=lp)
                return
            text = calls.push(ev.text) if calls is not None else ev.text
            if text or lps:
                yield chunk({"content": text}, logprobs=lp)
        elif isinstance(ev, P.Done):
            if calls is not None:  # the rest of what the answer returned whole says (issue 34, finding 8)
                rest = calls.finish(ev.content or "" if ev.tool_calls else None)
                if rest:
                    yield chunk({"content": rest})
            if ev.tool_calls:
                deltas = [{"index": i, **c} for i, c in enumerate(openai_calls(ev.tool_calls))]
                yield chunk({"tool_calls": deltas})
            yield chunk({}, job.finish_reason)

    return _framed(job, head, include_usage, chunk({"role": "assistant", "content": ""}), lines)


async def completions(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, CompletionRequest)
    refuse_unsupported(req)
    if req.echo:
        raise not_supported("echo")
    if req.suffix:
        raise not_supported("suffix")
    if req.best_of not in (None, 1):
        raise not_supported("best_of other than 1")
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise not_supported("prompt as a list of several prompts")
        prompt = prompt[0]
    model = svc.check_model(req.model)
    top = req.logprobs
    lp = want_logprobs(svc, model, top) if top is not None else 0
    spec = GenSpec(endpoint="completions", prompt=prompt, sampling=sampling_for(svc, req, req.max_tokens, model),
                   logprobs=lp, model=model)
    job = await svc.start(caller(request), spec, request.receive)
    cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return event_stream(_completion_stream(job, cid, created, model, top, usage))
    try:
        await job.collect()
    finally:
        job.close()
    if job.error is not None:
        raise _mid_error(job)
    choice = {"text": "".join(job.text), "index": 0,
              "logprobs": completion_logprobs(job.logprobs, top or 0, 0) if lp else None,
              "finish_reason": job.finish_reason}
    return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": model,
                         "choices": [choice], "usage": job.usage(), "system_fingerprint": None,
                         **job.context_fields()})


def _completion_stream(job: Job, cid: str, created: int, model: str, top: int | None,
                       include_usage: bool) -> AsyncIterator[str]:
    head = _chunk_head(cid, "text_completion", created, model)

    def chunk(text: str, finish: str | None = None, logprobs: Any = None) -> str:
        extra = job.context_fields() if finish else {}
        return sse({**head, "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
                    **extra})

    offset = 0

    def lines(ev: P.Event) -> Iterator[str]:
        nonlocal offset
        if isinstance(ev, P.Token):
            lps = getattr(ev, "logprobs", None)
            yield chunk(ev.text, logprobs=completion_logprobs(lps, top or 0, offset)
                        if top is not None and lps else None)
            offset += len(ev.text)
        elif isinstance(ev, P.Done):
            yield chunk("", job.finish_reason)

    return _framed(job, head, include_usage, None, lines)


async def _framed(job: Job, head: dict[str, Any], include_usage: bool, first: str | None,
                  lines: Callable[[P.Event], Iterator[str]]) -> AsyncIterator[str]:
    """One streamed response: `first`, each event's `lines`, then the usage chunk if asked for and
    [DONE]. A mid-stream error ends it with the error object; a client that went away ends it
    silently. The job is closed however the stream ends."""
    try:
        if first is not None:
            yield first
        async for ev in job.events():
            if job.disconnected:
                return  # nobody is reading: close() drains the rest
            if isinstance(ev, P.Error):
                yield sse(_mid_error(job).openai())
                return
            for line in lines(ev):
                yield line
        for line in _stream_end(head, job, include_usage):
            yield line
    finally:
        job.close()


def _chunk_head(cid: str, obj: str, created: int, model: str) -> dict[str, Any]:
    """The fields every streamed chunk of one response repeats."""
    return {"id": cid, "object": obj, "created": created, "model": model, "system_fingerprint": None}


def _stream_end(head: dict[str, Any], job: Job, include_usage: bool) -> Iterator[str]:
    """The end of a stream: the usage chunk if asked for (`stream_options.include_usage`), then [DONE]."""
    if include_usage:
        yield sse({**head, "choices": [], "usage": job.usage(), **job.context_fields()})
    yield "data: [DONE]\n\n"


def _mid_error(job: Job) -> ApiError:
    assert job.error is not None
    return engine_error(job.error)


ROUTES = [
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
]
