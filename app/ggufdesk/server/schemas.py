"""Request bodies of the OpenAI and Anthropic endpoints, validated strictly (wrong types are 400s)."""
from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ggufdesk.server.errors import invalid, not_supported

Stop = Optional[Union[str, list[str]]]


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: Optional[str] = None


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None  # a tool message answers this call


class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    """Sampling fields shared by the OpenAI endpoints (llama.cpp's extras included)."""

    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, ge=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0, le=1)
    repeat_penalty: Optional[float] = Field(None, ge=0, le=10)
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 1)
    stop: Stop = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    user: Optional[str] = None


class ChatRequest(SamplingFields):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[dict[str, Any]] = None


class CompletionRequest(SamplingFields):
    model: str
    prompt: Union[str, list[str]]
    max_tokens: Optional[int] = Field(16, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class AnthropicBlock(Strict):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: Optional[str] = None
    id: Optional[str] = None  # tool_use
    name: Optional[str] = None
    input: Optional[dict[str, Any]] = None
    tool_use_id: Optional[str] = None  # tool_result
    content: Optional[Union[str, list[TextPart]]] = None


class AnthropicMessage(Strict):
    role: Literal["user", "assistant"]
    content: Union[str, list[AnthropicBlock]]


class MessagesRequest(Strict):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: Optional[Union[str, list[AnthropicBlock]]] = None
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = Field(None, ge=0, le=1)
    top_p: Optional[float] = Field(None, ge=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    stream: bool = False
    metadata: Optional[dict[str, Any]] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None


def parse(model: type[Strict], body: bytes) -> Any:
    """The body as `model`, or a 400 that names the first bad field."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {e}") from None
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
