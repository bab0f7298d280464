"""Engine requests and events, defined once and used by both sides; JSON lines on the wire."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

# ---- requests (parent -> engine) -------------------------------------------------------------


@dataclass(kw_only=True)
class Load:
    TYPE: ClassVar[str] = "load"
    model: str
    settings: dict[str, Any] = field(default_factory=dict)  # LoadSettings fields
    draft: str | None = None
    speculation: dict[str, Any] = field(default_factory=dict)  # SpeculationSettings fields


@dataclass(kw_only=True)
class Generate:
    TYPE: ClassVar[str] = "generate"
    id: str
    prompt: str | None = None  # completion mode: raw text
    messages: list[dict[str, str]] | None = None  # chat mode: rendered with the model's template
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingSettings fields
    speculation: dict[str, Any] | None = None  # overrides the loaded SpeculationSettings
    context_policy: str = "truncate"  # "truncate" oldest turns or "refuse"


@dataclass(kw_only=True)
class Cancel:
    TYPE: ClassVar[str] = "cancel"
    id: str


@dataclass(kw_only=True)
class Unload:
    TYPE: ClassVar[str] = "unload"


@dataclass(kw_only=True)
class Shutdown:
    TYPE: ClassVar[str] = "shutdown"


# ---- events (engine -> parent) ---------------------------------------------------------------


@dataclass(kw_only=True)
class Ready:
    TYPE: ClassVar[str] = "ready"
    pid: int
    llama_cpp_version: str = ""
    system_info: str = ""
    devices: list[dict[str, Any]] = field(default_factory=list)  # ggml's: name, type, memory_free/total


@dataclass(kw_only=True)
class Loaded:
    TYPE: ClassVar[str] = "loaded"
    model: str
    arch: str = ""
    n_ctx: int = 0
    n_ctx_train: int = 0
    n_vocab: int = 0
    n_layer: int = 0
    n_gpu_layers: int = 0
    chat_format: str = "completion"  # "template" | "builtin:<name>" | "completion"
    memory: dict[str, int] = field(default_factory=dict)  # weights/kv/compute/draft bytes
    load_s: float = 0.0
    draft: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    rpc: dict[str, Any] = field(default_factory=dict)  # RPC workers: split, devices, prediction


@dataclass(kw_only=True)
class Unloaded:
    TYPE: ClassVar[str] = "unloaded"


@dataclass(kw_only=True)
class Progress:
    TYPE: ClassVar[str] = "progress"
    id: str
    phase: str  # "prefill"
    done: int
    total: int


@dataclass(kw_only=True)
class Token:
    TYPE: ClassVar[str] = "token"
    id: str
    text: str


@dataclass(kw_only=True)
class Stats:
    TYPE: ClassVar[str] = "stats"
    id: str
    n_prompt: int = 0  # prompt tokens, including reused ones
    n_reused: int = 0  # prompt tokens already in the KV cache
    n_gen: int = 0
    ttft_s: float = 0.0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    draft_len: int = 0
    speculation: str = "off"  # "off" | "draft" | "lookup" | "disabled: <why>"
    final: bool = False
    llama_perf: dict[str, Any] = field(default_factory=dict)  # final only: llama_perf_context timings


@dataclass(kw_only=True)
class Done:
    TYPE: ClassVar[str] = "done"
    id: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "context"
    text: str = ""
    tokens: list[int] = field(default_factory=list)  # the generated token ids
    usage: dict[str, int] = field(default_factory=dict)


@dataclass(kw_only=True)
class Error:
    TYPE: ClassVar[str] = "error"
    kind: str  # "load" | "settings" | "generate" | "context" | "crash" | "protocol" | "bug"
    message: str
    id: str | None = None
    detail: str = ""


@dataclass(kw_only=True)
class Log:
    TYPE: ClassVar[str] = "log"
    level: str
    text: str


REQUESTS = {c.TYPE: c for c in (Load, Generate, Cancel, Unload, Shutdown)}
EVENTS = {c.TYPE: c for c in (Ready, Loaded, Unloaded, Progress, Token, Stats, Done, Error, Log)}
_ALL = {**REQUESTS, **EVENTS}

Message = Any  # one of the dataclasses above


def fields_of(obj: Any) -> dict[str, Any]:
    """A settings dataclass (or a dict, or None) as the plain dict a message carries."""
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return dict(obj)


class ProtocolError(ValueError):
    """A line that is not a valid message."""


def encode(msg: Message) -> str:
    """One JSON line (ending in a newline) for a request or an event."""
    return json.dumps({"type": msg.TYPE, **dataclasses.asdict(msg)}, ensure_ascii=False) + "\n"


def decode(line: str | bytes) -> Message:
    """Parse one JSON line back into its dataclass; raises ProtocolError on anything else."""
    try:
        data = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {str(line)[:200]!r}") from e
    if not isinstance(data, dict) or data.get("type") not in _ALL:
        raise ProtocolError(f"unknown message: {str(line)[:200]!r}")
    cls = _ALL[data.pop("type")]
    try:
        return cls(**data)
    except TypeError as e:
        raise ProtocolError(f"bad {cls.TYPE} message: {e}") from e
