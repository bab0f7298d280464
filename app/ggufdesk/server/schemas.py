"""Request bodies of the OpenAI and Anthropic endpoints, validated strictly (wrong types are 400s)."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ggufdesk.core.schema import MAX_JSON_DEPTH, SchemaError, check_size
from ggufdesk.server.errors import invalid, not_supported

Stop = str | list[str] | None
# our extra field on every endpoint: what to do with a prompt longer than the context (docs/context.md)
ContextOverflow = Literal["error", "rolling", "truncate-middle", "shift"] | None
# Nesting levels in a request body: room for a schema at core/schema.py's own limit inside tools; every
# walker after json.loads (pydantic, the protocol's encoder, jsonschema) recurses once per level, and a
# 600-deep tool argument had killed the engine link (issue 34).
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 24


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message answers this call
    reasoning_content: str | None = None  # an assistant's earlier thinking (only templates that ask render it)


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    """Sampling fields shared by the OpenAI endpoints (llama.cpp's extras included)."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repeat_penalty: float | None = Field(None, ge=0, le=10)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    context_overflow: ContextOverflow = None


class ChatRequest(SamplingFields):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None  # server/reasoning.py
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget: int | None = None
    think: bool | str | None = None


class CompletionRequest(SamplingFields):
    model: str
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class AnthropicBlock(Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[TextPart] | None = None


class AnthropicMessage(Strict):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock]


class MessagesRequest(Strict):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[AnthropicBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    context_overflow: ContextOverflow = None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def load_json(body: bytes) -> Any:
    """The body as plain JSON: strict (no NaN/Infinity, no number that overflows) and at most
    MAX_BODY_DEPTH levels deep; a 400 otherwise. CPU-bound on a large body: call it off the event loop."""
    try:
        data = json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise invalid(f"the request body is nested too deeply (more than {MAX_BODY_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {str(e)[:200]}") from None
    try:
        check_size(data, what="the request body", max_values=sys.maxsize, max_depth=MAX_BODY_DEPTH)
    except SchemaError:
        raise invalid(f"the request body is nested too deeply (more than {MAX_BODY_DEPTH} levels)") from None
    return data


def parse(model: type[Strict], body: bytes) -> Any:
    """The body as `model`, or a 400 that names the first bad field."""
    data = load_json(body)
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise invalid(f"{where}: {err['msg']}", param=where or None) from None


def stops(stop: Stop) -> list[str]:
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if len(items) > 16:
        raise invalid("stop: at most 16 stop strings", param="stop")
    return [s for s in items if s]


def refuse_unsupported(req: SamplingFields) -> None:
    """Fields we cannot honour are refused, never silently ignored."""
    if req.n != 1:
        raise not_supported("n other than 1")
    if req.presence_penalty or req.frequency_penalty:
        raise not_supported("presence_penalty/frequency_penalty (use repeat_penalty)")
    if req.logit_bias:
        raise not_supported("logit_bias")


def text_of(content: Any, where: str) -> str:
    """A message's content (a string or text parts) as one string; other parts are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise not_supported(f"{where} content of type {part.type!r}")
        out.append(part.text)
    return "".join(out)
