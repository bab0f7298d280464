"""OpenAI's Responses API: POST /v1/responses (streaming: the full event sequence) and GET/DELETE /v1/responses/{id}.

What Codex and the openai SDK send: `instructions`, string or item `input` (messages, function_call,
function_call_output; reasoning items are skipped), function tools with tool_choice, text.format
(json_object, json_schema), max_output_tokens, `reasoning.effort` (a reasoning model's thinking comes
back as a reasoning item with reasoning_text content, streamed as response.reasoning_text.delta, as
gpt-oss on OpenAI's own servers answers). Built-in tool types we do not
have (web_search, file_search, namespace, custom...) are ignored and named in the response header
`X-Ggufdesk-Ignored-Tools`. previous_response_id continues a stored response: responses are kept in
memory, per server run, newest RESPONSE_STORE of them (`store: false` keeps none).
"""
from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ggufdesk.core.toolcalls import CallStream
from ggufdesk.core.tools import GENERIC
from ggufdesk.engine.link import protocol as P
from ggufdesk.server import reasoning, structured
from ggufdesk.server.errors import ApiError, invalid, not_supported
from ggufdesk.server.http import caller, event_stream, off_loop, parse_body, service, sse
from ggufdesk.server.images import RequestImages, responses_image, with_images, with_text
from ggufdesk.server.llamacpp import progress as prompt_progress
from ggufdesk.server.sampling import sampling_from
from ggufdesk.server.schemas import ContextOverflow, Strict, system_first
from ggufdesk.server.service import GenSpec, Job, Service, engine_error

log = logging.getLogger("ggufdesk.server")
RESPONSE_STORE = 256  # responses kept for previous_response_id and GET, oldest forgotten first
MAX_ITEMS = 4096  # input items in one request


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | int | None = Field(None, ge=0, le=2)
    top_p: float | int | None = Field(None, ge=0, le=1)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": none|minimal|low|medium|high, "summary": ...}
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None  # OpenAI's: auto drops the oldest turns (rolling)
    context_overflow: ContextOverflow = None  # ours, as on every API (docs/context.md)
    # llama-server's streaming extensions: `timings` on each text delta, response.in_progress events with
    # `prompt_progress` while the prompt is read
    timings_per_token: bool = False
    return_progress: bool = False


@dataclass
class Stored:
    """A finished response: its JSON, and the conversation it ends (for previous_response_id)."""

    body: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)  # engine messages, instructions excluded
    images: dict[str, str] = field(default_factory=dict)  # sha256 -> base64 of the history's image parts


class ResponseStore:
    """The newest `limit` responses, by id, in memory."""

    def __init__(self, limit: int = RESPONSE_STORE) -> None:
        self.limit = limit
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, rid: str, item: Stored) -> None:
        self._items[rid] = item
        self._items.move_to_end(rid)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        return self._items.get(rid)

    def delete(self, rid: str) -> bool:
        return self._items.pop(rid, None) is not None


def store_of(request: Request) -> ResponseStore:
    """The server's store (one per app, made at its first use)."""
    state = request.app.state
    if not hasattr(state, "responses"):
        state.responses = ResponseStore()
    store: ResponseStore = state.responses
    return store


# ---- request -> engine ----------------------------------------------------------------------------


def _text(content: Any, where: str, found: RequestImages | None = None) -> str | list[dict[str, Any]]:
    """A message's content: a string, or input_text/output_text parts, and input_image parts when the
    route reads images (`found`): then the image parts followed by the text (server/images.py)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of parts", param="input")
    out: list[str] = []
    pics: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "summary_text") and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "input_image" and found is not None:
            pics.append(responses_image(part, f"{where}.content[{j}]", found))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise not_supported(f"{where}.content[{j}] of type {kind!r} (this model reads text only)")
        elif kind != "refusal":
            raise invalid(f"{where}.content[{j}] must be an input_text part", param="input")
    return with_text(pics, "".join(out))


def input_messages(items: str | list[dict[str, Any]], found: RequestImages | None = None) -> list[dict[str, Any]]:
    """Input items as the engine's messages: function_call items join the assistant turn before them
    as tool_calls, function_call_output items become tool messages, reasoning items are skipped."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if len(items) > MAX_ITEMS:
        raise invalid(f"input holds {len(items)} items; at most {MAX_ITEMS}", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        _add_item(out, item, f"input[{i}]", found)
    return out


def _add_item(out: list[dict[str, Any]], item: dict[str, Any], where: str,
              found: RequestImages | None = None) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise invalid(f"{where}.role must be user, assistant, system or developer", param="input")
        found = found if role == "user" else None  # images come from the user
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), where, found)})
    elif kind == "function_call":
        name, args, cid = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
        if not (isinstance(name, str) and isinstance(args, str) and isinstance(cid, str)):
            raise invalid(f"{where}: a function_call needs name, arguments and call_id strings", param="input")
        call = {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        if out and out[-1]["role"] == "assistant":
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        cid, output = item.get("call_id"), item.get("output")
        if not isinstance(cid, str):
            raise invalid(f"{where}: a function_call_output needs its call_id", param="input")
        out.append({"role": "tool", "tool_call_id": cid,
                    "content": output if isinstance(output, str) else _text(output, where)})
    elif kind != "reasoning":  # a reasoning model's own notes (Codex sends them back): not read again
        raise not_supported(f"{where} of type {kind!r}")


def tool_fields(tools: list[dict[str, Any]] | None, choice: Any,
                parallel: bool | None) -> tuple[dict[str, Any], list[str]]:
    """Generate's tool fields for the function tools, and the built-in tool types left out."""
    functions, ignored = [], []
    for i, t in enumerate(tools or []):
        if not isinstance(t, dict):
            raise invalid(f"tools[{i}] must be an object", param="tools")
        if t.get("type") != "function":
            ignored.append(str(t.get("type")))
            continue
        fn = {k: t[k] for k in ("name", "description", "parameters") if k in t and t[k] is not None}
        functions.append({"type": "function", "function": fn})
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise not_supported(f"tool_choice of type {choice.get('type')!r}")
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if not functions:
        return ({} if choice in (None, "auto", "none") else structured.openai_tools(None, choice, parallel)), ignored
    return structured.openai_tools(functions, choice, parallel), ignored


def text_format(text: dict[str, Any] | None) -> dict[str, Any]:
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return {}
    if fmt.get("type") == "json_schema":
        return {"json_schema": structured.response_format({"type": "json_schema", "json_schema": fmt})}
    return {"json_schema": structured.response_format(fmt)}


# ---- engine -> response -----------------------------------------------------------------------------


def _ids() -> tuple[str, str]:
    return f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"


def reasoning_item(rsid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "reasoning", "id": rsid, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def message_item(mid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_" + call["id"].removeprefix("call_"), "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"], "status": status}


@dataclass
class Draft:
    """What a response says about itself, before and after its output exists."""

    rid: str
    model: str
    req: ResponsesRequest
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict[str, Any]], job: Job | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.req
        usage = None
        if job is not None and status != "in_progress":
            p, c, cached = job.prompt_tokens, job.completion_tokens, job.cached_tokens
            usage = {"input_tokens": p, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": c,
                     "output_tokens_details": {"reasoning_tokens": job.reasoning_tokens or 0}, "total_tokens": p + c}
        return {
            "id": self.rid, "object": "response", "created_at": self.created, "status": status,
            "error": error, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens, "model": self.model,
            "output": output, "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id, "reasoning": r.reasoning or {"effort": None,
                                                                                          "summary": None},
            "store": r.store, "temperature": r.temperature, "text": r.text or {"format": {"type": "text"}},
            "tool_choice": r.tool_choice or "auto", "tools": [t for t in r.tools or [] if t.get("type") == "function"],
            "top_p": r.top_p, "truncation": r.truncation or "disabled", "usage": usage, "user": r.user,
            "metadata": r.metadata or {}, **(job.context_fields() if job is not None and usage else {}),
        }


def final_output(job: Job, mid: str) -> list[dict[str, Any]]:
    done = job.done
    thought = [reasoning_item("rs_" + mid.removeprefix("msg_"), "".join(job.reasoning))] if job.reasoning else []
    if done is not None and done.tool_calls:
        head = [message_item(mid, done.content)] if done.content else []
        return thought + head + [call_item(c) for c in done.tool_calls]
    return thought + [message_item(mid, "".join(job.text))]


def status_of(job: Job) -> str:
    return "incomplete" if job.finish_reason == "length" else "completed"


def remember(store: ResponseStore, draft: Draft, body: dict[str, Any], history: list[dict[str, Any]], job: Job) -> None:
    if not draft.req.store:
        return
    answer = job.done
    turn: dict[str, Any] = {"role": "assistant", "content": (answer.content or "") if answer and answer.tool_calls
                            else "".join(job.text)}
    if answer is not None and answer.tool_calls:
        turn["tool_calls"] = answer.tool_calls
    store.put(draft.rid, Stored(body=body, history=[*history, turn], images=dict(job.spec.images)))


# ---- routes -------------------------------------------------------------------------------------------


def responses_spec(svc: Service, req: ResponsesRequest, model: str,
                   history: list[dict[str, Any]], fresh: list[dict[str, Any]],
                   images: dict[str, str]) -> tuple[GenSpec, dict[str, Any], list[str]]:
    """The generation a Responses request asks for, checked (400s), given the stored conversation it
    continues, its input as messages (`fresh`, read by the route with their `images`); with its tool
    fields and the built-in tool types left out."""
    history += fresh
    if not any(m["role"] in ("user", "tool", "assistant") for m in history):
        raise invalid("input must hold at least one message", param="input")
    tools, ignored = tool_fields(req.tools, req.tool_choice, req.parallel_tool_calls)
    fmt = text_format(req.text)
    if tools and fmt:
        raise invalid("use text.format or tools, not both", param="text")
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    overflow = req.context_overflow or ("rolling" if req.truncation == "auto" else None)
    sampling = sampling_from(svc, model, max_tokens=req.max_output_tokens, temperature=req.temperature,
                             top_p=req.top_p, context_overflow=overflow)
    think = reasoning.openai_fields(effort=(req.reasoning or {}).get("effort"))
    spec = GenSpec(endpoint="responses", messages=system_first(system + history), sampling=sampling,
                   structured=tools or fmt, reasoning=think, model=model, images=images, stream=req.stream)
    return spec, tools, ignored


async def create(request: Request) -> Response:
    svc = service(request)
    req = await parse_body(request, ResponsesRequest, svc.config.max_image_body)
    model = svc.check_model(req.model)
    history: list[dict[str, Any]] = []
    images: dict[str, str] = {}
    if req.previous_response_id:
        prev = store_of(request).get(req.previous_response_id)
        if prev is None:
            raise ApiError(404, f"the response {req.previous_response_id!r} is not stored here (responses are kept "
                                f"in memory, the newest {RESPONSE_STORE}, until the server stops)",
                           code="previous_response_not_found", param="previous_response_id", reason="invalid")
        history, images = list(prev.history), dict(prev.images)
    fresh, found = await with_images(request, model, lambda r, f: input_messages(r.input, f), req)
    spec, tools, ignored = await off_loop(responses_spec, svc, req, model, history, fresh, {**images, **found})
    if ignored:
        log.info("responses: ignoring tools of types %s (not available here)", ", ".join(sorted(set(ignored))))
    job = await svc.start(caller(request), spec, request.receive)
    rid, mid = _ids()
    draft = Draft(rid=rid, model=model, req=req)
    headers = {"X-Ggufdesk-Ignored-Tools": ", ".join(sorted(set(ignored)))} if ignored else {}
    calls = CallStream(job.pool.tool_format or GENERIC) if "tools" in tools else None
    if req.stream:
        # a silent stream (a long prompt being read) repeats response.in_progress: Codex, like Claude Code,
        # gives up on a stream after 300 s without an event
        seq = Sequencer()
        if req.timings_per_token:
            seq.timings = job.timings
        resp = event_stream(_stream(store_of(request), job, draft, mid, history, calls, seq, req.return_progress),
                            beat=lambda: seq.event("response.in_progress", response=draft.body("in_progress", [])))
        resp.headers.update(headers)
        return resp
    await job.complete()
    body = draft.body(status_of(job), final_output(job, mid), job)
    remember(store_of(request), draft, body, history, job)
    return JSONResponse(body, headers=headers)


class Sequencer:
    """The events of one stream, numbered in order (sequence_number)."""

    def __init__(self) -> None:
        self.n = 0
        self.timings: Callable[[], dict[str, Any]] | None = None  # timings_per_token: added to each delta

    def event(self, kind: str, **data: Any) -> str:
        self.n += 1
        if self.timings is not None and kind.endswith(".delta"):
            data["timings"] = self.timings()
        return sse({"type": kind, "sequence_number": self.n - 1, **data}, kind)


class Output:
    """The output items of one streamed response as its events say them: a reasoning item while a
    reasoning model thinks, a message item opened at its first text, closed before the calls; a
    function_call item per call."""

    def __init__(self, ev: Any, mid: str) -> None:
        self.ev, self.mid = ev, mid
        self.rsid = "rs_" + mid.removeprefix("msg_")
        self.text: list[str] = []
        self.thought: list[str] = []
        self.opened = False  # the message item
        self.thinking = False  # the reasoning item is open
        self.index = 0  # output_index of the item open now
        self.items: list[dict[str, Any]] = []

    def think(self, piece: str) -> list[str]:
        """Reasoning text for the reasoning item (opening it first)."""
        if not piece or self.opened:
            return []
        lines = [] if self.thinking else self._open_reasoning()
        self.thinking = True
        self.thought.append(piece)
        return lines + [self.ev("response.reasoning_text.delta", item_id=self.rsid, output_index=self.index,
                                content_index=0, delta=piece)]

    def say(self, piece: str) -> list[str]:
        """Text for the message item (opening it first)."""
        if not piece:
            return []
        lines = [] if self.opened else self._open()
        self.opened = True
        self.text.append(piece)
        return lines + [self.ev("response.output_text.delta", item_id=self.mid, output_index=self.index,
                                content_index=0, delta=piece, logprobs=[])]

    def end(self, calls: list[dict[str, Any]]) -> list[str]:
        """The message item closed (an empty one when there is nothing else), then one item per call."""
        lines = self._close_reasoning()
        if self.opened or not calls:
            lines += [] if self.opened else self._open()
            lines += self._close()
        for call in calls:
            lines += _call_events(self.ev, call, len(self.items))
            self.items.append(call_item(call))
        return lines

    def _open_reasoning(self) -> list[str]:
        ev, self.index = self.ev, len(self.items)
        return [ev("response.output_item.added", output_index=self.index,
                   item={**reasoning_item(self.rsid, "", "in_progress"), "content": []}),
                ev("response.content_part.added", item_id=self.rsid, output_index=self.index, content_index=0,
                   part={"type": "reasoning_text", "text": ""})]

    def _close_reasoning(self) -> list[str]:
        if not self.thinking:
            return []
        self.thinking = False
        ev, whole = self.ev, "".join(self.thought)
        item = reasoning_item(self.rsid, whole)
        self.items.append(item)
        return [ev("response.reasoning_text.done", item_id=self.rsid, output_index=self.index, content_index=0,
                   text=whole),
                ev("response.content_part.done", item_id=self.rsid, output_index=self.index, content_index=0,
                   part=item["content"][0]),
                ev("response.output_item.done", output_index=self.index, item=item)]

    def _open(self) -> list[str]:
        lines = self._close_reasoning()
        ev, mid, self.index = self.ev, self.mid, len(self.items)
        return lines + [
            ev("response.output_item.added", output_index=self.index,
               item={**message_item(mid, "", "in_progress"), "content": []}),
            ev("response.content_part.added", item_id=mid, output_index=self.index, content_index=0,
               part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

    def _close(self) -> list[str]:
        ev, mid, k = self.ev, self.mid, self.index
        whole = "".join(self.text)
        item = message_item(mid, whole)
        self.items.append(item)
        return [ev("response.output_text.done", item_id=mid, output_index=k, content_index=0, text=whole, logprobs=[]),
                ev("response.content_part.done", item_id=mid, output_index=k, content_index=0,
                   part=item["content"][0]),
                ev("response.output_item.done", output_index=k, item=item)]


async def _stream(store: ResponseStore, job: Job, draft: Draft, mid: str, history: list[dict[str, Any]],
                  calls: CallStream | None, seq: Sequencer | None = None, progress: bool = False) -> AsyncIterator[str]:
    """response.created, in_progress, then a message item (output_item.added, content_part.added,
    output_text.delta..., output_text.done, content_part.done, output_item.done) and a function_call
    item per call (added, function_call_arguments.delta/.done, done), then response.completed with
    llama-server's `timings` beside the response. With `progress` (llama-server's return_progress), a
    response.in_progress with `prompt_progress` for each part of the prompt read."""
    ev = (seq or Sequencer()).event
    out = Output(ev, mid)
    t0 = time.perf_counter()
    try:
        yield ev("response.created", response=draft.body("in_progress", []))
        yield ev("response.in_progress", response=draft.body("in_progress", []))
        async for e in job.events():
            if job.disconnected:
                return
            lines: list[str] = []
            if isinstance(e, P.Progress) and progress:
                lines = [ev("response.in_progress", response=draft.body("in_progress", []),
                            prompt_progress=prompt_progress(e, t0))]
            elif isinstance(e, P.Token) and e.reasoning:
                lines = out.think(e.text)
            elif isinstance(e, P.Token):
                lines = out.say(calls.push(e.text) if calls is not None else e.text)
            elif isinstance(e, P.Done):
                held = calls.finish() if calls is not None and not e.tool_calls else ""
                lines = out.say(held) + out.say((e.content or "") if e.tool_calls and not out.opened else "")
                lines += out.end(e.tool_calls)
            elif isinstance(e, P.Error):
                err = engine_error(e)
                yield ev("response.failed", response=draft.body("failed", out.items, job, {
                    "code": err.code or "server_error", "message": err.message}))
                return
            for line in lines:
                yield line
        body = draft.body(status_of(job), out.items, job)
        remember(store, draft, body, history, job)
        yield ev("response.completed" if body["status"] == "completed" else "response.incomplete", response=body,
                 timings=job.timings())
    finally:
        job.close()


def _call_events(ev: Any, call: dict[str, Any], index: int) -> list[str]:
    item = call_item(call)
    return [ev("response.output_item.added", output_index=index, item={**call_item(call, "in_progress"),
                                                                      "arguments": ""}),
            ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
               delta=item["arguments"]),
            ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
               name=item["name"], arguments=item["arguments"]),
            ev("response.output_item.done", output_index=index, item=item)]


async def retrieve(request: Request) -> Response:
    stored = store_of(request).get(request.path_params["rid"])
    if stored is None:
        raise ApiError(404, f"no response with id {request.path_params['rid']!r} is stored here",
                       code="not_found", reason="invalid")
    return JSONResponse(stored.body)


async def delete(request: Request) -> Response:
    rid = request.path_params["rid"]
    if not store_of(request).delete(rid):
        raise ApiError(404, f"no response with id {rid!r} is stored here", code="not_found", reason="invalid")
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


ROUTES = [
    Route("/v1/responses", create, methods=["POST"]),
    Route("/responses", create, methods=["POST"]),
    Route("/v1/responses/{rid}", retrieve, methods=["GET"]),
    Route("/v1/responses/{rid}", delete, methods=["DELETE"]),
]
