"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions (streaming and not).

llama-server's request extensions (server/llamacpp.py) work here too: grammar, json_schema,
response_format {"type": "json_object", "schema"}, n_predict, n_probs, timings_per_token,
return_progress, verbose; responses carry llama-server's `timings` beside OpenAI's fields.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk import __version__
from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import GENERIC
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.errors import ApiError, invalid, not_supported
from ggufdesk.server.http import caller, event_stream, off_loop, parse_body, service, sse
from ggufdesk.server.images import RequestImages, with_images
from ggufdesk.server.llamacpp import (extension_structured, final_fields, progress, prompt_echo, refuse_extensions,
                                      timings)
from ggufdesk.server.sampling import sampling_from
from ggufdesk.server.schemas import (ChatRequest, CompletionRequest, LlamaRequest, SamplingFields, refuse_unsupported,
                                     stops, text_of)
from ggufdesk.server.service import GenSpec, Job, Service, complete_all, engine_error


def sampling_for(svc: Service, req: SamplingFields, max_tokens: int | None, model: str) -> SamplingSettings:
    return sampling_from(svc, model, max_tokens=max_tokens, stop=stops(req.stop), temperature=req.temperature,
                         top_p=req.top_p, top_k=req.top_k, min_p=req.min_p, repeat_penalty=req.repeat_penalty,
                         seed=req.seed, context_overflow=req.context_overflow)


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
    constrained = extension_structured(req, req.response_format)
    tools = structured.openai_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    if tools and ("json_schema" in constrained or "grammar" in constrained):
        raise invalid("use response_format (or grammar, json_schema) or tools, not both", param="response_format")
    return {**constrained, **tools}


def fingerprint(svc: Service) -> str:
    """system_fingerprint: the backend's build (llama-server's start with "b" and its build, so do ours)."""
    ready = getattr(getattr(svc.pool, "_client", None), "ready", None)
    return f"b{getattr(ready, 'llama_cpp_version', '') or 'unknown'}-ggufdesk-{__version__}"


async def verbose_fields(svc: Service, req: LlamaRequest, job: Job) -> dict[str, Any]:
    """llama-server's `__verbose` (with `verbose: true`, or on every answer with `serve --verbose`): the
    native answer /completion gives, with the prompt as the model read it."""
    if not (req.verbose or svc.config.verbose):
        return {}
    model = job.spec.model or svc.model_id
    return {"__verbose": final_fields(job, req, model, "".join(job.text), await prompt_echo(svc, model, job.spec))}


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


async def chat_spec(svc: Service, req: ChatRequest, request: Request) -> tuple[GenSpec, int]:
    """The generation a chat request asks for, checked (400s), and its top-N logprobs (0: none)."""
    refuse_unsupported(req)
    refuse_extensions(req)
    if req.continue_final_message and req.add_generation_prompt:
        raise invalid("continue_final_message and add_generation_prompt cannot both be true",
                      param="continue_final_message")
    if req.n > 1 and req.stream:
        raise not_supported("n other than 1 when streaming")
    extra = await off_loop(chat_structured, req)
    model = svc.check_model(req.model)
    top = req.top_logprobs or req.n_probs or 0
    lp = want_logprobs(svc, model, top) if req.logprobs or req.n_probs else 0
    sampling = sampling_for(svc, req, req.max_completion_tokens or req.max_tokens or positive(req.n_predict), model)
    think = reasoning.openai_fields(effort=req.reasoning_effort, template_kwargs=req.chat_template_kwargs,
                                    budget=req.reasoning_budget, think=req.think)
    messages, images = await with_images(request, model, chat_messages, req)
    return GenSpec(endpoint="chat", messages=messages, sampling=sampling, logprobs=lp, structured=extra,
                   reasoning=think, model=model, images=images, stream=req.stream), top


async def chat_completions(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, ChatRequest, svc.config.max_image_body)
    spec, top = await chat_spec(svc, req, request)
    model, extra, lp = spec.model, spec.structured, spec.logprobs
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    head = _chunk_head(cid, "chat.completion.chunk", created, model, fingerprint(svc))
    if req.stream:
        job = await svc.start(caller(request), spec, request.receive)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        calls = CallStream(job.pool.tool_format or GENERIC) if "tools" in extra else None
        return event_stream(_chat_stream(job, head, top if lp else None, include_usage, calls, Extras.of(req)))
    jobs = await _collect_n(svc, request, spec, req.n)
    choices = [_chat_choice(i, job, top if lp else None) for i, job in enumerate(jobs)]
    usage = jobs[0].usage()
    usage["completion_tokens"] = sum(j.completion_tokens for j in jobs)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return JSONResponse({"id": cid, "object": "chat.completion", "created": created, "model": model,
                         "choices": choices, "usage": usage, "system_fingerprint": head["system_fingerprint"],
                         "timings": timings(jobs[0]), **jobs[0].context_fields(),
                         **await verbose_fields(svc, req, jobs[0])})


async def _collect_n(svc: Service, request: Request, spec: GenSpec, n: int) -> list[Job]:
    """n answers to one request (OpenAI's `n`): n generations side by side, each admitted like any."""
    jobs: list[Job] = []
    try:
        for _ in range(n):
            jobs.append(await svc.start(caller(request), spec, request.receive))
    except BaseException:
        for job in jobs:
            job.close()
        raise
    await complete_all(jobs)
    return jobs


def _chat_choice(index: int, job: Job, top: int | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(job.text)}
    if job.done is not None and job.done.tool_calls:
        message = {"role": "assistant", "content": job.done.content or None,
                   "tool_calls": openai_calls(job.done.tool_calls)}
    if job.reasoning:  # as llama-server and DeepSeek: the thinking beside the answer
        message["reasoning_content"] = "".join(job.reasoning)
    return {"index": index, "message": message, "logprobs": chat_logprobs(job.logprobs, top) if top is not None
            else None, "finish_reason": job.finish_reason}


def positive(n: int | None) -> int | None:
    """llama-server's n_predict as a token budget (-1: until the model stops or the context is full)."""
    return None if n is None else (1 << 20) if n < 0 else max(1, n)


@dataclass
class Extras:
    """llama-server's streaming extensions a request asked for."""

    timings: bool = False  # timings_per_token: `timings` in every chunk
    progress: bool = False  # return_progress: prompt_progress chunks while the prompt is read

    @classmethod
    def of(cls, req: Any) -> Extras:
        return cls(timings=bool(req.timings_per_token), progress=bool(req.return_progress))


def _chat_stream(job: Job, head: dict[str, Any], top: int | None, include_usage: bool, calls: CallStream | None,
                 extras: Extras) -> AsyncIterator[str]:
    """Chunks as tokens come; with tools, text that may be a call is held back and calls come at the end."""

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

    return _framed(job, head, include_usage, chunk({"role": "assistant", "content": None}), lines, extras)


async def completions(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, CompletionRequest)
    refuse_unsupported(req)
    refuse_extensions(req)
    if req.n != 1:
        raise not_supported("n other than 1 (here; /v1/chat/completions takes it)")
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
    top = req.logprobs if req.logprobs is not None else req.n_probs
    lp = want_logprobs(svc, model, top) if top is not None else 0
    max_tokens = positive(req.n_predict) if req.n_predict is not None and "max_tokens" not in req.model_fields_set \
        else req.max_tokens
    spec = GenSpec(endpoint="completions", prompt=prompt, sampling=sampling_for(svc, req, max_tokens, model),
                   logprobs=lp, structured=await off_loop(extension_structured, req), model=model,
                   stream=req.stream)
    job = await svc.start(caller(request), spec, request.receive)
    cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    head = _chunk_head(cid, "text_completion", created, model, fingerprint(svc))
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return event_stream(_completion_stream(job, head, top, usage, Extras.of(req)))
    await job.complete()
    choice = {"text": "".join(job.text), "index": 0,
              "logprobs": completion_logprobs(job.logprobs, top or 0, 0) if lp else None,
              "finish_reason": job.finish_reason}
    return JSONResponse({"id": cid, "object": "text_completion", "created": created, "model": model,
                         "choices": [choice], "usage": job.usage(), "system_fingerprint": head["system_fingerprint"],
                         "timings": timings(job), **job.context_fields(), **await verbose_fields(svc, req, job)})


def _completion_stream(job: Job, head: dict[str, Any], top: int | None, include_usage: bool,
                       extras: Extras) -> AsyncIterator[str]:
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

    return _framed(job, head, include_usage, None, lines, extras)


async def _framed(job: Job, head: dict[str, Any], include_usage: bool, first: str | None,
                  lines: Callable[[P.Event], Iterator[str]], extras: Extras) -> AsyncIterator[str]:
    """One streamed response: `first`, each event's `lines`, then the usage chunk if asked for and
    [DONE]. A mid-stream error ends it with the error object; a client that went away ends it
    silently. The job is closed however the stream ends. With llama-server's extensions: progress
    chunks (no choices) while the prompt is read, `timings` in every chunk after the first."""
    t0 = time.perf_counter()
    try:
        if first is not None:
            yield first
        async for ev in job.events():
            if job.disconnected:
                return  # nobody is reading: close() drains the rest
            if isinstance(ev, P.Error):
                yield sse(_mid_error(job).openai())
                return
            if isinstance(ev, P.Progress) and extras.progress:
                yield sse({**head, "choices": [], "prompt_progress": progress(ev, t0)})
            for line in lines(ev):
                yield line if not extras.timings else _with_timings(line, job)
        for line in _stream_end(head, job, include_usage):
            yield line
    finally:
        job.close()


def _with_timings(line: str, job: Job) -> str:
    data = json.loads(line[6:])
    return sse({**data, "timings": timings(job)})


def _chunk_head(cid: str, obj: str, created: int, model: str, fingerprint: str | None = None) -> dict[str, Any]:
    """The fields every streamed chunk of one response repeats."""
    return {"id": cid, "object": obj, "created": created, "model": model, "system_fingerprint": fingerprint}


def _stream_end(head: dict[str, Any], job: Job, include_usage: bool) -> Iterator[str]:
    """The end of a stream: the usage chunk if asked for (`stream_options.include_usage`, with llama-server's
    `timings`), then [DONE]."""
    if include_usage:
        yield sse({**head, "choices": [], "usage": job.usage(), "timings": timings(job), **job.context_fields()})
    yield "data: [DONE]\n\n"


async def input_tokens(request: Request) -> Response:
    """llama-server's /chat/completions/input_tokens: the prompt's tokens for these messages and tools."""
    svc = service(request)
    req = await parse_body(request, ChatRequest)
    tools = structured.openai_tools(req.tools, req.tool_choice, req.parallel_tool_calls)
    model = svc.check_model(req.model)
    think = reasoning.openai_fields(effort=req.reasoning_effort, template_kwargs=req.chat_template_kwargs,
                                    think=req.think).get("think")
    out = await svc.tokenize(model, messages=chat_messages(req), tools=tools.get("tools"),
                             tool_choice=tools.get("tool_choice"), think=think)
    return JSONResponse({"input_tokens": len(out.tokens)})


def _mid_error(job: Job) -> ApiError:
    assert job.error is not None
    return engine_error(job.error)


ROUTES = [
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),  # llama-server serves it without /v1 too
    Route("/chat/completions/input_tokens", input_tokens, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
]
