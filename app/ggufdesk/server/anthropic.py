"""Anthropic-compatible route: POST /v1/messages, streaming (the real event sequence) and not."""
from __future__ import annotations

import uuid
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine import protocol as P
from ggufdesk.server.errors import invalid, not_supported
from ggufdesk.server.http import caller, event_stream, read_body, service, sse
from ggufdesk.server.schemas import MessagesRequest, parse, text_of
from ggufdesk.server.service import GenSpec, Job, Service, engine_error

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def sampling_for(svc: Service, req: MessagesRequest) -> SamplingSettings:
    d = svc.config.sampling
    stop = [s for s in (req.stop_sequences or []) if s]
    if len(stop) > 16:
        raise invalid("stop_sequences: at most 16", param="stop_sequences")
    try:
        return SamplingSettings(
            temperature=d.temperature if req.temperature is None else req.temperature,
            top_p=d.top_p if req.top_p is None else req.top_p,
            top_k=d.top_k if req.top_k is None else req.top_k,
            min_p=d.min_p, repeat_penalty=d.repeat_penalty, repeat_last_n=d.repeat_last_n, seed=d.seed,
            max_tokens=req.max_tokens, stop=stop,
        )
    except SettingsError as e:
        raise invalid(str(e)) from None


def messages_of(req: MessagesRequest) -> list[dict[str, str]]:
    out = []
    if req.system:
        out.append({"role": "system", "content": text_of(req.system, "system")})
    for i, m in enumerate(req.messages):
        out.append({"role": m.role, "content": text_of(m.content, f"messages[{i}]")})
    return out


def stop_reason(job: Job) -> str:
    return STOP_REASONS[job.finish_reason]


async def messages(request: Request) -> Response:
    svc = service(request)
    req: MessagesRequest = parse(MessagesRequest, await read_body(request, svc.config.max_body))
    if req.tools or req.tool_choice:
        raise not_supported("tools (tool use)")
    if req.thinking and req.thinking.get("type") != "disabled":
        raise not_supported("thinking")
    svc.check_model(req.model)
    spec = GenSpec(endpoint="messages", messages=messages_of(req), sampling=sampling_for(svc, req))
    job = await svc.start(caller(request), spec, request.receive)
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if req.stream:
        return event_stream(_stream(job, mid, svc.model_id))
    try:
        await job.collect()
    finally:
        job.close()
    if job.error is not None:
        raise engine_error(job.error)
    return JSONResponse({
        "id": mid, "type": "message", "role": "assistant", "model": svc.model_id,
        "content": [{"type": "text", "text": "".join(job.text)}],
        "stop_reason": stop_reason(job), "stop_sequence": None,
        "usage": {"input_tokens": job.prompt_tokens, "output_tokens": job.completion_tokens},
    })


async def _stream(job: Job, mid: str, model: str) -> AsyncIterator[str]:
    def message(usage_in: int) -> dict[str, Any]:
        return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": usage_in, "output_tokens": 0}}

    started = False
    try:
        async for ev in job.events():
            if not started and not isinstance(ev, P.Error):
                started = True
                known = ev.total if isinstance(ev, P.Progress) else job.prompt_tokens
                yield sse({"type": "message_start", "message": message(known)}, "message_start")
                yield sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                          "content_block_start")
                yield sse({"type": "ping"}, "ping")
            if isinstance(ev, P.Token) and ev.text:
                yield sse({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": ev.text}}, "content_block_delta")
            elif isinstance(ev, P.Done):
                yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
                yield sse({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason(job), "stop_sequence": None},
                           "usage": {"input_tokens": job.prompt_tokens, "output_tokens": job.completion_tokens}},
                          "message_delta")
                yield sse({"type": "message_stop"}, "message_stop")
            elif isinstance(ev, P.Error):
                yield sse(engine_error(ev).anthropic(), "error")
                return
    finally:
        job.close()


ROUTES = [Route("/v1/messages", messages, methods=["POST"])]
