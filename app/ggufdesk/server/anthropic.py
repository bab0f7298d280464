"""Anthropic-compatible route: POST /v1/messages, streaming (the real event sequence) and not."""
from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import GENERIC
from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.errors import invalid, not_supported
from ggufdesk.server.http import caller, event_stream, off_loop, parse_body, service, sse
from ggufdesk.server.images import RequestImages, with_images
from ggufdesk.server.schemas import MessagesRequest, text_of
from ggufdesk.server.service import GenSpec, Job, Service, engine_error

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def sampling_for(svc: Service, req: MessagesRequest, model: str) -> SamplingSettings:
    d = svc.sampling_defaults(model)
    stop = [s for s in (req.stop_sequences or []) if s]
    if len(stop) > 16:
        raise invalid("stop_sequences: at most 16", param="stop_sequences")
    try:
        return SamplingSettings(
            temperature=d.temperature if req.temperature is None else req.temperature,
            top_p=d.top_p if req.top_p is None else req.top_p,
            top_k=d.top_k if req.top_k is None else req.top_k,
            min_p=d.min_p, repeat_penalty=d.repeat_penalty, repeat_last_n=d.repeat_last_n, seed=d.seed,
            max_tokens=req.max_tokens, stop=stop, think=d.think, reasoning_budget=d.reasoning_budget,
            context_overflow=d.context_overflow if req.context_overflow is None else req.context_overflow,
        )
    except SettingsError as e:
        raise invalid(str(e)) from None


def messages_of(req: MessagesRequest, images: RequestImages | None = None) -> list[dict[str, Any]]:
    """Anthropic turns as the engine's (OpenAI-style) messages: tool_use blocks become tool_calls,
    tool_result blocks become role "tool" messages, image blocks the engine's image parts."""
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": text_of(req.system, "system")})
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text: list[Any] = []
        calls: list[dict[str, Any]] = []
        for j, b in enumerate(m.content):
            where = f"messages[{i}].content[{j}]"
            if b.type == "text":
                text.append(b.text or "")
            elif b.type == "image" and m.role == "user" and images is not None:
                text.append(image_block(b, where, images))
            elif b.type == "tool_use" and m.role == "assistant":
                calls.append({"id": b.id or f"call_{i}_{j}", "type": "function",
                              "function": {"name": b.name or "", "arguments": json.dumps(b.input or {})}})
            elif b.type == "tool_result" and m.role == "user":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id or "",
                            "content": text_of(b.content, where)})
            else:
                raise not_supported(f"{where} of type {b.type!r}")
        if text or calls or m.role == "assistant":
            msg: dict[str, Any] = {"role": m.role, "content": joined(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def usage(job: Job) -> dict[str, int]:
    """Anthropic's usage: input_tokens are those not read from a cache (theirs add up to the prompt)."""
    cached = job.cached_tokens
    return {"input_tokens": job.prompt_tokens - cached, "output_tokens": job.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def image_block(b: Any, where: str, images: RequestImages) -> dict[str, Any]:
    """An Anthropic image block (source: base64, or url with --allow-remote-images) as an engine image part."""
    source = getattr(b, "source", None)
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return images.part_from_base64(source.get("data"), f"{where}.source")
    if kind == "url":
        return images.part_from_url(source.get("url"), f"{where}.source")
    raise invalid(f"{where}.source: an image source of type {kind!r}; use base64 (or url)", param=where,
                  code="invalid_image")


def joined(parts: list[Any]) -> str | list[dict[str, Any]]:
    """Text blocks as one string; with images, the engine's parts in order."""
    if all(isinstance(p, str) for p in parts):
        return "".join(parts)
    return [p if isinstance(p, dict) else {"type": "text", "text": p} for p in parts]


def stop_reason(job: Job) -> str:
    if job.finish_reason == "stop" and stop_sequence(job) is not None:
        return "stop_sequence"
    return STOP_REASONS[job.finish_reason]


def stop_sequence(job: Job) -> str | None:
    """The stop sequence that ended the answer (None when the model ended it or it ran out)."""
    return job.done.stop if job.done is not None else None


async def messages(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, MessagesRequest, svc.config.max_image_body)
    extra = await off_loop(structured.anthropic_tools, req.tools, req.tool_choice)
    think = reasoning.anthropic_fields(req.thinking)
    model = svc.check_model(req.model)
    msgs, images = await with_images(request, model, messages_of, req)
    spec = GenSpec(endpoint="messages", messages=msgs, sampling=sampling_for(svc, req, model),
                   structured=extra, reasoning=think, model=model, images=images)
    job = await svc.start(caller(request), spec, request.receive)
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if req.stream:
        calls = CallStream(job.pool.tool_format or GENERIC) if extra else None
        reasons = bool(getattr(job.pool.loaded, "reasoning", None))
        return event_stream(_stream(job, mid, model, calls, reasons))
    try:
        await job.collect()
    finally:
        job.close()
    if job.error is not None:
        raise engine_error(job.error)
    content: list[dict[str, Any]] = [{"type": "text", "text": "".join(job.text)}]
    if job.done is not None and job.done.tool_calls:
        content = ([{"type": "text", "text": job.done.content}] if job.done.content else []) + [
            structured.anthropic_tool_use(c) for c in job.done.tool_calls]
    if job.reasoning:  # a thinking block first, as Anthropic's extended thinking
        content.insert(0, {"type": "thinking", "thinking": "".join(job.reasoning), "signature": ""})
    return JSONResponse({
        "id": mid, "type": "message", "role": "assistant", "model": model,
        "content": content,
        "stop_reason": stop_reason(job), "stop_sequence": stop_sequence(job), "usage": usage(job),
        **job.context_fields(),
    })


class _Blocks:
    """Anthropic's content blocks as a stream opens them: thinking (if the model reasons), text, tool uses."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # the open block's type
        self.texts = 0  # text blocks opened

    def open(self, kind: str) -> Iterator[str]:
        if self.kind == kind:
            return
        yield from self.close()
        self.index += 1
        self.kind = kind
        self.texts += kind == "text"
        block = ({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                 else {"type": "text", "text": ""})
        yield sse({"type": "content_block_start", "index": self.index, "content_block": block}, "content_block_start")

    def close(self) -> Iterator[str]:
        if self.kind is None:
            return
        if self.kind == "thinking":
            yield self.delta({"type": "signature_delta", "signature": ""})
        yield sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")
        self.kind = None

    def delta(self, delta: dict[str, Any]) -> str:
        return sse({"type": "content_block_delta", "index": self.index, "delta": delta}, "content_block_delta")

    def token(self, ev: P.Token, calls: CallStream | None) -> Iterator[str]:
        if ev.reasoning:
            yield from self.open("thinking")
            yield self.delta({"type": "thinking_delta", "thinking": ev.text})
            return
        text = calls.push(ev.text) if calls is not None else ev.text
        if text:
            yield from self.open("text")
            yield self.delta({"type": "text_delta", "text": text})

    def ending(self, job: Job, ev: P.Done, calls: CallStream | None) -> Iterator[str]:
        """The rest of the text (what the answer returned whole says), the tool uses, the message's end."""
        rest = calls.finish(ev.content or "" if ev.tool_calls else None) if calls is not None else ""
        if rest or (not self.texts and not ev.tool_calls):  # an answer, if only an empty one
            yield from self.open("text")
        if rest:
            yield self.delta({"type": "text_delta", "text": rest})
        yield from self.close()
        for call in ev.tool_calls:
            use = structured.anthropic_tool_use(call)
            self.index += 1
            k = self.index
            yield sse({"type": "content_block_start", "index": k, "content_block": {**use, "input": {}}},
                      "content_block_start")
            yield sse({"type": "content_block_delta", "index": k,
                       "delta": {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}},
                      "content_block_delta")
            yield sse({"type": "content_block_stop", "index": k}, "content_block_stop")
        yield sse({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason(job), "stop_sequence": stop_sequence(job)},
                   "usage": usage(job), **job.context_fields()}, "message_delta")
        yield sse({"type": "message_stop"}, "message_stop")


async def _stream(job: Job, mid: str, model: str, calls: CallStream | None, reasons: bool) -> AsyncIterator[str]:
    """Anthropic's event sequence: a thinking block while the model reasons (`reasons`: it may), a text
    block for the answer; with tools, call text is held back and each call becomes a tool_use block
    (content_block_start + one input_json_delta + content_block_stop) at the end."""
    def message(usage_in: int) -> dict[str, Any]:
        return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": 0}}

    started = False
    blocks = _Blocks()
    try:
        async for ev in job.events():
            if job.disconnected:
                return  # nobody is reading: close() drains the rest
            lines: Iterator[str] = iter(())
            if not started and not isinstance(ev, P.Error):
                started = True
                known = ev.total if isinstance(ev, P.Progress) else job.prompt_tokens
                yield sse({"type": "message_start", "message": message(known)}, "message_start")
                if not reasons:  # the text block at once, as Anthropic sends it
                    for line in blocks.open("text"):
                        yield line
                yield sse({"type": "ping"}, "ping")
            if isinstance(ev, P.Token) and ev.text:
                lines = blocks.token(ev, calls)
            elif isinstance(ev, P.Done):
                lines = blocks.ending(job, ev, calls)
            elif isinstance(ev, P.Error):
                yield sse(engine_error(ev).anthropic(), "error")
                return
            for line in lines:
                yield line
    finally:
        job.close()


ROUTES = [Route("/v1/messages", messages, methods=["POST"])]
