"""Anthropic-compatible routes: POST /v1/messages (streaming: the real event sequence) and /v1/messages/count_tokens.

Requests are taken as Claude Code sends them today: system turns among the messages, thinking,
context_management, output_config, metadata and any other field we do not use are accepted
(`?beta=true` too); output_config.format (a JSON schema) is honoured.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import GENERIC
from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.errors import invalid, not_supported
from ggufdesk.server.http import caller, event_stream, off_loop, parse_body, service, sse
from ggufdesk.server.images import RequestImages, with_images
from ggufdesk.server.sampling import sampling_from
from ggufdesk.server.schemas import (AnthropicBlock, AnthropicMessage, CountTokensRequest, MessagesRequest,
                                     system_first, text_of)
from ggufdesk.server.service import GenSpec, Job, Service, engine_error

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def sampling_for(svc: Service, req: MessagesRequest, model: str) -> SamplingSettings:
    stop = [s for s in (req.stop_sequences or []) if s]
    if len(stop) > 16:
        raise invalid("stop_sequences: at most 16", param="stop_sequences")
    return sampling_from(svc, model, max_tokens=req.max_tokens, stop=stop, temperature=req.temperature,
                         top_p=req.top_p, top_k=req.top_k, context_overflow=req.context_overflow)


# Content blocks a model's earlier turn may hold that are not for the model to read again: its own
# reasoning (Anthropic drops it from earlier turns too) and results of Anthropic's server tools.
SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result",
                            "web_fetch_tool_result", "code_execution_tool_result", "mcp_tool_use", "mcp_tool_result"})


def messages_of(req: MessagesRequest | CountTokensRequest, images: RequestImages | None = None) -> list[dict[str, Any]]:
    """Anthropic turns as the engine's (OpenAI-style) messages: tool_use blocks become tool_calls,
    tool_result blocks become role "tool" messages, image blocks the engine's image parts, and system
    text (the `system` field, then system turns wherever they stand among the messages, in order)
    becomes one system message at the start."""
    out: list[dict[str, Any]] = [{"role": "system", "content": text_of(req.system, "system")}] if req.system else []
    for i, m in enumerate(req.messages):
        if m.role == "system":
            out.append({"role": "system", "content": _text(m.content, f"messages[{i}]")})
        elif isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        else:
            out += _turn(i, m, images)
    return system_first(out)


@dataclass
class _Parts:
    """What one turn's blocks add up to."""

    text: list[Any] = field(default_factory=list)  # strings, and image parts
    calls: list[dict[str, Any]] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)  # tool messages, before the turn


def _turn(i: int, m: AnthropicMessage, images: RequestImages | None = None) -> list[dict[str, Any]]:
    """One user or assistant turn of blocks: its tool results first (as tool messages), then the turn."""
    parts = _Parts()
    assert not isinstance(m.content, str)  # (messages_of takes a plain string turn as it is)
    for j, b in enumerate(m.content):
        _read_block(parts, b, m.role, i, j, images)
    out = parts.results
    if parts.text or parts.calls or m.role == "assistant":
        msg: dict[str, Any] = {"role": m.role, "content": joined(parts.text)}
        if parts.calls:
            msg["tool_calls"] = parts.calls
        if parts.thinking:
            msg["reasoning_content"] = "\n".join(parts.thinking)
        out.append(msg)
    return out


def _read_block(parts: _Parts, b: AnthropicBlock, role: str, i: int, j: int, images: RequestImages | None) -> None:
    where = f"messages[{i}].content[{j}]"
    if b.type == "text":
        parts.text.append(b.text or "")
    elif b.type == "image" and role == "user" and images is not None:
        parts.text.append(image_block(b, where, images))
    elif b.type == "thinking" and role == "assistant":
        if b.thinking:
            parts.thinking.append(b.thinking)  # the template renders it if it knows reasoning
    elif b.type == "tool_use" and role == "assistant":
        parts.calls.append({"id": b.id or f"call_{i}_{j}", "type": "function",
                            "function": {"name": b.name or "", "arguments": json.dumps(b.input or {})}})
    elif b.type == "tool_result" and role == "user":
        parts.results.append({"role": "tool", "tool_call_id": b.tool_use_id or "",
                              "content": text_of(b.content, where)})
    elif b.type not in SKIPPED_BLOCKS:
        raise not_supported(f"{where} of type {b.type!r}")


def _text(content: str | list[AnthropicBlock], where: str) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.text or "" for b in content if b.type == "text")


def usage_counts(prompt: int, out: int, cached: int = 0) -> dict[str, int]:
    """Anthropic's usage: input_tokens are those not read from a cache; with cache_read_input_tokens they
    add up to the prompt (as Anthropic's prompt caching counts them, and Claude Code adds them up)."""
    return {"input_tokens": prompt - cached, "output_tokens": out, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}


def usage(job: Job) -> dict[str, int]:
    return usage_counts(job.prompt_tokens, job.completion_tokens, job.cached_tokens)


def image_block(b: Any, where: str, images: RequestImages) -> dict[str, Any]:
    """An Anthropic image block (source: base64, or url with --allow-remote-images) as an engine image part."""
    given = getattr(b, "source", None)
    source: dict[str, Any] = given if isinstance(given, dict) else {}
    kind = source.get("type")
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
    """The client's stop sequence that ended the answer; None when the model ended it, it ran out, or
    a stop string of our own (a transcript template's "\nUser:") ended it."""
    stop = job.done.stop if job.done is not None else None
    return stop if stop is not None and stop in job.spec.sampling.stop else None


def request_structured(req: MessagesRequest) -> dict[str, Any]:
    """Generate's structured fields: tools, or output_config.format's JSON schema (not both)."""
    extra = structured.anthropic_tools(req.tools, req.tool_choice)
    fmt = (req.output_config or {}).get("format") or req.output_format
    if fmt is None:
        return extra
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise invalid("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                      param="output_config")
    if extra:
        raise not_supported("output_config.format together with tools")
    schema = structured.response_format({"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}})
    return {"json_schema": schema}


async def messages_spec(svc: Service, req: MessagesRequest, request: Request) -> GenSpec:
    """The generation a Messages request asks for, checked (400s), its images read."""
    extra = await off_loop(request_structured, req)
    model = svc.check_model(req.model)
    msgs, images = await with_images(request, model, messages_of, req)
    return GenSpec(endpoint="messages", messages=msgs, sampling=sampling_for(svc, req, model), structured=extra,
                   reasoning=reasoning.anthropic_fields(req.thinking), model=model, images=images,
                   stream=req.stream)


async def messages(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, MessagesRequest, svc.config.max_image_body)
    spec = await messages_spec(svc, req, request)
    job = await svc.start(caller(request), spec, request.receive)
    mid, model = f"msg_{uuid.uuid4().hex[:24]}", spec.model
    if req.stream:
        calls = CallStream(job.pool.tool_format or GENERIC) if "tools" in spec.structured else None
        reasons = bool(getattr(job.pool.loaded, "reasoning", None))
        blocks = _Blocks()
        return event_stream(_stream(job, mid, model, calls, reasons, blocks), beat=blocks.beat)
    await job.complete()
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

    def beat(self) -> str | None:
        """What a silent stream sends (a long prompt being read): Claude Code gives up after 300 s without
        an event its SDK passes on, and the SDK drops `ping`; an empty delta of the open block adds nothing.
        None (an SSE comment) while no block is open."""
        if self.kind == "text":
            return self.delta({"type": "text_delta", "text": ""})
        if self.kind == "thinking":
            return self.delta({"type": "thinking_delta", "thinking": ""})
        return None

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


async def _stream(job: Job, mid: str, model: str, calls: CallStream | None, reasons: bool,
                  blocks: _Blocks) -> AsyncIterator[str]:
    """Anthropic's event sequence: a thinking block while the model reasons (`reasons`: it may), a text
    block for the answer; with tools, call text is held back and each call becomes a tool_use block
    (content_block_start + one input_json_delta + content_block_stop) at the end."""
    def message(prompt: int, cached: int) -> dict[str, Any]:
        return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage_counts(prompt, 0, cached)}

    started = False
    blocks = _Blocks()
    try:
        async for ev in job.events():
            if job.disconnected:
                return  # nobody is reading: close() drains the rest
            lines: Iterator[str] = iter(())
            if not started and not isinstance(ev, P.Error):
                started = True
                if isinstance(ev, P.Progress) and ev.n_prompt:  # the prompt, less what a cache already held
                    head = message(ev.n_prompt, max(0, ev.n_prompt - ev.total))
                else:
                    head = message(job.prompt_tokens, job.cached_tokens)
                yield sse({"type": "message_start", "message": head}, "message_start")
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


async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as a generation would see them: template, system text and tools included."""
    svc = service(request)
    req = await parse_body(request, CountTokensRequest)
    extra = await off_loop(structured.anthropic_tools, req.tools, req.tool_choice)
    model = svc.check_model(req.model)
    out = await svc.tokenize(model, messages=messages_of(req), tools=extra.get("tools"),
                             tool_choice=extra.get("tool_choice"),
                             think=reasoning.anthropic_fields(req.thinking).get("think"))
    return JSONResponse({"input_tokens": len(out.tokens)})


ROUTES = [Route("/v1/messages", messages, methods=["POST"]),
          Route("/v1/messages/count_tokens", count_tokens, methods=["POST"])]
