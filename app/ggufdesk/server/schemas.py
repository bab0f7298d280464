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
MAX_N = 8  # choices in one chat request (each is a generation of its own)
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
    # OpenAI's {"token id": bias}; llama-server's [[token id or text, bias or false]] and text keys
    logit_bias: dict[str, float | bool | None] | list[list[int | float | bool | str]] | None = None
    user: str | None = None
    context_overflow: ContextOverflow = None


class LlamaFields(Strict):
    """llama-server's request extensions (server/llamacpp.py says what each does here)."""

    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    n_probs: int | None = Field(None, ge=0, le=20)
    n_predict: int | None = Field(None, ge=-2)
    cache_prompt: bool = True
    id_slot: int | None = None
    n_keep: int | None = None
    timings_per_token: bool = False
    return_progress: bool = False
    return_tokens: bool = False
    mirostat: int | None = None
    typical_p: float | int | None = None
    dry_multiplier: float | int | None = None
    xtc_probability: float | int | None = None
    dynatemp_range: float | int | None = None
    top_n_sigma: float | int | None = None
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    ignore_eos: bool = False
    post_sampling_probs: bool = False
    min_keep: int | None = None
    lora: list[Any] | None = None
    image_data: list[Any] | None = None
    multimodal_data: list[Any] | None = None
    samplers: list[str] | str | None = None
    verbose: bool = False  # add the rendered prompt as "__verbose"


class LlamaRequest(SamplingFields, LlamaFields):
    """A completion request of any API with llama-server's extensions (what its native fields read)."""


class ChatRequest(LlamaRequest):
    model: str | None = None  # OpenAI requires it; llama-server does not (one model is served)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: Any | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool = False  # vLLM's name for continuing a final assistant message (the default)
    add_generation_prompt: bool = True
    reasoning_effort: str | None = None  # server/reasoning.py
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_budget: int | None = None
    think: bool | str | None = None


class CompletionRequest(LlamaRequest):
    model: str | None = None
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
    thinking: str | None = None  # thinking (an assistant's earlier reasoning)
    content: str | list[TextPart] | None = None


class AnthropicMessage(Strict):
    role: Literal["user", "assistant", "system"]  # Claude Code puts system turns among the messages
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
    thinking: dict[str, Any] | None = None  # accepted; ignored until the model reasons
    output_config: dict[str, Any] | None = None  # format (a JSON schema) is honoured; effort is ignored
    output_format: dict[str, Any] | None = None  # the structured-outputs beta's older name for the format
    context_overflow: ContextOverflow = None


class CountTokensRequest(Strict):
    model: str | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicBlock] | None = None
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
    return validate(model, data)


def validate(model: type[Strict], data: dict[str, Any]) -> Any:
    """`data` as `model`, or a 400 that names the first bad field."""
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
    if req.n > MAX_N:
        raise invalid(f"n: at most {MAX_N} choices", param="n")
    if req.presence_penalty or req.frequency_penalty:
        raise not_supported("presence_penalty/frequency_penalty (use repeat_penalty)")


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


def system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """System (and developer) turns wherever they stand, joined in order into one system message at the
    start: most chat templates take a system prompt only there (Claude Code and Codex send several)."""
    system = [m["content"] for m in messages if m["role"] == "system" and m["content"]]
    rest = [m for m in messages if m["role"] != "system"]
    return ([{"role": "system", "content": "\n\n".join(system)}] if system else []) + rest
