"""Engine requests and events, defined once and used by both sides; JSON lines on the wire.

Every message is a dataclass; a line is decoded and validated from the annotations by pydantic
(strict: no "12" for 12), so the kinds a receiver branches on (ErrorKind, FinishReason, EngineState)
and the settings dataclasses a Load or Generate carries are checked once, where they arrive. Every
request that starts work carries an `id`, and every event about that work carries the same `id`
(docs/architecture.md, "The protocol").
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeVar, get_args

from pydantic import ConfigDict, TypeAdapter, ValidationError

from ggufdesk.core.errors import KnownError, SettingsError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings

# ---- the kinds a receiver branches on --------------------------------------------------------

ErrorKind = Literal[
    "load",  # the model (or the load request) failed; no model is loaded
    "settings",  # a load or sampling setting was refused before anything ran
    "template",  # notice during a load: the chat template is broken; completion mode instead
    "draft",  # notice during a load: the draft model was refused; speculation is off
    "generate",  # a generation failed
    "context",  # the prompt can never fit one sequence's context (server: 400)
    "overloaded",  # the engine's queue is full or memory is under its margin; try again later (503)
    "schema",  # a JSON schema, grammar or tool list the engine cannot follow (server: 400)
    "image",  # an image the engine cannot use: unreadable, too large, or the model reads no images (400)
    "projector",  # notice during a load: the vision projector was refused; the model reads text only
    "crash",  # (client) the engine process died
    "hung",  # (client) the engine stopped answering, or did not stop when asked; it was killed
    "timeout",  # the request ran past its Generate.deadline_s and was stopped (server: 504)
    "protocol",  # a line that is not a valid message
    "bug",  # an internal error of ours, with a trace in `detail`
]
FinishReason = Literal["stop", "length", "cancelled", "context", "tool_calls"]
OverflowPolicy = Literal["error", "rolling", "truncate-middle", "shift"]  # core/settings.py OVERFLOW_POLICIES
EngineState = Literal[
    "stopped",  # not started, or shut down
    "starting",  # the process is starting (first start or a restart)
    "ready",  # running, no model loaded
    "loading",  # a load request is in flight
    "loaded",  # a model is loaded
    "failed",  # the engine cannot run (did not start, or keeps crashing); `reason` says why
]
LogLevel = Literal["debug", "info", "warning", "error"]

ERROR_KINDS: Final = frozenset(get_args(ErrorKind))
FINISH_REASONS: Final = frozenset(get_args(FinishReason))
ENGINE_STATES: Final = frozenset(get_args(EngineState))
# Errors that end the engine process's work: a fresh engine is starting (or could not).
STOP_KINDS: Final[frozenset[ErrorKind]] = frozenset({"crash", "hung"})
# Errors a load reports on its way to a successful Loaded (the model itself is fine).
LOAD_NOTICE_KINDS: Final[frozenset[ErrorKind]] = frozenset({"template", "draft", "projector"})

# ---- requests (parent -> engine) -------------------------------------------------------------


@dataclass(kw_only=True)
class Load:
    TYPE: ClassVar[str] = "load"
    id: str | None = None
    model: str
    settings: LoadSettings = field(default_factory=LoadSettings)
    draft: str | None = None
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    # a vision model's projector (mmproj-*.gguf): images in its prompts. None: the one beside the model
    # file, if any (core/projector.py projector_beside); "": none
    mmproj: str | None = None


@dataclass(kw_only=True)
class Generate:
    TYPE: ClassVar[str] = "generate"
    id: str
    prompt: str | None = None  # completion mode: raw text
    prompt_tokens: list[int] | None = None  # completion mode: token ids, as they are (instead of prompt)
    # chat mode: rendered with the model's template. A message's content is text, or a list of parts:
    # {"type": "text", "text": ...} and {"type": "image", "image": sha256} (the file's bytes in `images`)
    messages: list[dict[str, Any]] | None = None
    images: dict[str, str] = field(default_factory=dict)  # sha256 -> the image file, base64
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    speculation: dict[str, Any] | None = None  # SpeculationSettings fields over the loaded ones
    # (a prompt longer than the context: sampling.context_overflow, engine/runtime/overflow.py)
    logprobs: int = 0  # 0 = off; N = the top-N alternatives (with their logprobs) for every token
    # structured output (engine/structured/request.py), at most one of the three:
    json_schema: dict[str, Any] | str | None = None  # a JSON schema, or "json_object" for any object
    grammar: str | None = None  # GBNF text with a `root` rule
    tools: list[dict[str, Any]] | None = None  # OpenAI-style function tools (chat requests)
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    parallel_tool_calls: bool = False  # up to 4 calls in one answer (off: one, as llama-server)
    logit_bias: dict[str, float | None] | None = None  # token id -> added to its logit (None: never sampled)
    # llama-server's text keys: each [text, bias] adds bias to every token of text (tokenized without BOS)
    logit_bias_text: list[list[Any]] | None = None
    cache_prompt: bool = True  # False: no cached prefix is reused for this prompt (llama-server's cache_prompt)
    ignore_eos: bool = False  # end-of-generation tokens are never sampled: it runs to max_tokens
    # reasoning models (core/reasoning.py): None = sampling.think (auto: template_switches); True/False; or an effort
    # "low"|"medium"|"high"; an off switch the template lacks becomes a budget of 0
    think: bool | str | None = None
    reasoning_budget: int | None = None  # reasoning tokens before the engine closes the block (None: no limit)
    # tools whose parameters the grammar cannot enforce: offered, their arguments only held to be an object
    tools_without_grammar: list[str] | None = None
    # seconds the request may take in the engine, queueing included; past it the engine ends it with
    # Error(kind="timeout") between two steps, so a request stuck in slow sampling frees its slot
    deadline_s: float | None = None
    # False: nobody reads the tokens as they come (a non-streaming HTTP request); while only such requests
    # decode, waiting prompts are read a whole batch a step (engine/batching/scheduler.py)
    stream: bool = True


@dataclass(kw_only=True)
class Embed:
    """Embeddings of `inputs` (texts, or token id lists), computed by the loaded model with its pooling
    (mean for a chat model), L2-normalised; answered by Embeddings (or Error). Cancel stops it."""

    TYPE: ClassVar[str] = "embed"
    id: str
    inputs: list[str | list[int]]
    truncate: bool = False  # cut an input longer than the embedding context instead of refusing it


@dataclass(kw_only=True)
class Tokenize:
    """Token ids of a text, or of a chat prompt rendered exactly as a generation would render it
    (template, tools), or, with `tokens`, the text of token ids. Answered by Tokenized (or Error)."""

    TYPE: ClassVar[str] = "tokenize"
    id: str
    text: str | None = None
    messages: list[dict[str, Any]] | None = None  # a chat prompt; tools/tool_choice as in Generate
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    tokens: list[int] | None = None  # detokenize these
    add_special: bool = True  # text: add the model's BOS (and EOS if it adds one)
    parse_special: bool = True  # text: special-token text (<|im_start|>) becomes the special token
    with_pieces: bool = False  # also each token's text
    add_generation_prompt: bool = True  # messages: end with the assistant turn's opening
    think: bool | str | None = None  # messages: as Generate.think (the caller passes its default: there
    # is no sampling here), so the prompt ends as a generation's would (an open or closed think block)


@dataclass(kw_only=True)
class Cancel:
    TYPE: ClassVar[str] = "cancel"
    id: str  # the request to cancel


@dataclass(kw_only=True)
class Unload:
    TYPE: ClassVar[str] = "unload"
    id: str | None = None


@dataclass(kw_only=True)
class Shutdown:
    TYPE: ClassVar[str] = "shutdown"


@dataclass(kw_only=True)
class Ping:
    """Heartbeat: the engine answers Pong from its request reader, even in the middle of a decode."""

    TYPE: ClassVar[str] = "ping"
    id: str


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
    id: str | None = None  # the Load request's
    model: str
    arch: str = ""
    n_ctx: int = 0
    n_ctx_train: int = 0
    n_vocab: int = 0
    n_layer: int = 0
    n_gpu_layers: int = 0
    chat_format: str = "completion"  # "template" | "builtin:<name>" | "completion"
    reasoning: str | None = None  # the template's reasoning format (core/reasoning.py), None: none
    tool_format: str = "generic"  # the template's tool-call format (core/tools.py)
    memory: dict[str, int] = field(default_factory=dict)  # weights/kv/compute/draft bytes
    load_s: float = 0.0  # Load to Loaded: the model, a projector or draft model, the draft-cost measurement
    draft: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    rpc: dict[str, Any] = field(default_factory=dict)  # RPC workers: split, devices, prediction
    n_embd: int = 0  # the size of the model's embedding vectors
    embedding_only: bool = False  # an embedding model (an encoder, or one that declares its pooling): no generation
    mmproj: str | None = None  # the vision projector loaded beside it (None: the model reads text only)
    image_tokens: int = 0  # with a projector: tokens an image of the projector's own size takes


@dataclass(kw_only=True)
class Unloaded:
    TYPE: ClassVar[str] = "unloaded"
    id: str | None = None


@dataclass(kw_only=True)
class Loading:
    """A load moved on to its next stage; a crash is blamed on the file being loaded."""

    TYPE: ClassVar[str] = "loading"
    id: str | None = None
    stage: Literal["model", "draft", "projector"]
    path: str


@dataclass(kw_only=True)
class Progress:
    TYPE: ClassVar[str] = "progress"
    id: str
    phase: Literal["prefill"]
    done: int
    total: int  # tokens to prefill (the prompt less what the KV cache already held)
    n_prompt: int = 0  # the whole prompt, reused tokens included


@dataclass(kw_only=True)
class Token:
    TYPE: ClassVar[str] = "token"
    id: str
    text: str
    # with Generate.logprobs: one entry per token behind `text`:
    # {"token": str, "logprob": float, "id": int, "top": [{"token": str, "logprob": float, "id": int}, ...]}
    logprobs: list[dict[str, Any]] | None = None
    reasoning: bool = False  # a reasoning model's thinking, not its answer


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
    drafts: int = 0  # drafts verified (steps that checked drafted tokens)
    speculation: str = "off"  # "off" | "draft" | "lookup" | "disabled: <why>"
    threads: int = 0  # CPU threads decoding now (engine/batching/threads.py; 0: not told)
    final: bool = False
    llama_perf: dict[str, Any] = field(default_factory=dict)  # final only: llama_perf_context timings


@dataclass(kw_only=True)
class Overflow:
    """The request's overflow policy dropped tokens to fit the context (engine/runtime/overflow.py): sent
    before its first token when the prompt was fitted, and again after each context shift. The
    counts are the request's totals so far."""

    TYPE: ClassVar[str] = "overflow"
    id: str
    policy: OverflowPolicy  # the policy that dropped them
    truncated_tokens: int  # tokens dropped (prompt tokens, and with "shift" tokens shifted out)
    dropped_messages: int = 0  # whole messages left out of the prompt (rolling)
    n_ctx: int = 0  # the context they did not fit
    note: str = ""  # e.g. the model cannot shift its context, so rolling was used instead


@dataclass(kw_only=True)
class Done:
    TYPE: ClassVar[str] = "done"
    id: str
    finish_reason: FinishReason
    text: str = ""
    tokens: list[int] = field(default_factory=list)  # the generated token ids
    # prompt_tokens, completion_tokens; cached_tokens: prompt tokens served from a cache (memory or disk),
    # restored_tokens: of them, read from the disk prompt cache; truncated_tokens: dropped to fit (Overflow)
    usage: dict[str, int] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI-style, parsed from text
    content: str | None = None  # with tool calls: the text that is not a call
    stop: str | None = None  # finish_reason "stop" because of this stop string (None: end of generation)
    overflow: str = ""  # the overflow policy that dropped usage["truncated_tokens"] ("" when none was dropped)
    reasoning: str | None = None  # a reasoning model's thinking (`text` is then the answer alone)
    warnings: list[str] = field(default_factory=list)  # e.g. a tool call that could not be read
    # the bias the sampler applied, as [token id, bias or None for never] (logit_bias, its text keys
    # tokenized, and ignore_eos's end-of-generation tokens); empty when none was asked for
    logit_bias: list[list[Any]] = field(default_factory=list)


@dataclass(kw_only=True)
class Embeddings:
    """The answer to Embed: one unit-length vector per input, in order."""

    TYPE: ClassVar[str] = "embeddings"
    id: str
    vectors: list[list[float]]
    n_tokens: list[int] = field(default_factory=list)  # tokens each input was read as
    truncated: list[bool] = field(default_factory=list)  # inputs cut to fit (Embed.truncate)
    pooling: str = "mean"  # "mean" | "cls" | "last"
    model: str = ""
    n_decode: int = 0  # llama_decode calls they took


@dataclass(kw_only=True)
class Tokenized:
    """The answer to Tokenize."""

    TYPE: ClassVar[str] = "tokenized"
    id: str
    tokens: list[int] = field(default_factory=list)
    text: str = ""  # the rendered chat prompt (messages), the detokenized text (tokens), or the text given
    pieces: list[str | list[int]] | None = None  # with_pieces: each token's text (its bytes when not UTF-8)


@dataclass(kw_only=True)
class Error:
    TYPE: ClassVar[str] = "error"
    kind: ErrorKind
    message: str
    id: str | None = None  # the request it ends (None: about the engine as a whole)
    detail: str = ""
    out_of_memory: bool = False  # a load or generation that failed for lack of (V)RAM


@dataclass(kw_only=True)
class Status:
    """The batched engine's load, sent when it changes (at most ~4 per second)."""

    TYPE: ClassVar[str] = "status"
    running: int = 0  # sequences being prefilled or decoded
    queued: int = 0  # requests waiting for free KV cells
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    n_parallel: int = 1
    spec: str = "off"  # speculation now: "off" | "lookup" | "draft" | "paused" (every drafter paused or disabled)
    # since the model was loaded: llama_decode calls for requests' rows (not images, not drafting), and the
    # sequences they served summed (n_busy / n_decode: sequences per call); sent at once when a request ends
    n_decode: int = 0
    n_busy: int = 0


@dataclass(kw_only=True)
class Log:
    TYPE: ClassVar[str] = "log"
    level: LogLevel
    text: str
    id: str | None = None


@dataclass(kw_only=True)
class Pong:
    TYPE: ClassVar[str] = "pong"
    id: str  # the Ping's


@dataclass(kw_only=True)
class Lifecycle:
    """Made by the client, not the engine: the engine process's state changed (and why)."""

    TYPE: ClassVar[str] = "lifecycle"
    state: EngineState
    reason: str = ""
    restarted: bool = False  # the state was reached by a restart after a crash or a hang


Request = Load | Generate | Embed | Tokenize | Cancel | Unload | Shutdown | Ping
Event = (Ready | Loaded | Unloaded | Loading | Progress | Token | Stats | Overflow | Done | Embeddings | Tokenized
         | Error | Status | Log | Pong | Lifecycle)
Message = Request | Event

REQUESTS: Final[dict[str, type[Any]]] = {
    c.TYPE: c for c in (Load, Generate, Embed, Tokenize, Cancel, Unload, Shutdown, Ping)}
EVENTS: Final[dict[str, type[Any]]] = {c.TYPE: c for c in (
    Ready, Loaded, Unloaded, Loading, Progress, Token, Stats, Overflow, Done, Embeddings, Tokenized, Error, Status,
    Log, Pong, Lifecycle)}
_ALL: Final[dict[str, type[Any]]] = {**REQUESTS, **EVENTS}
_S = TypeVar("_S", LoadSettings, SamplingSettings, SpeculationSettings)
_SURROGATES = re.compile("[\ud800-\udfff]")


def fields_of(obj: Any) -> dict[str, Any]:
    """A settings dataclass (or a dict, or None) as the plain dict a message carries."""
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return dict(obj)


def settings_of(cls: type[_S], obj: _S | dict[str, Any] | None) -> _S:
    """A settings dataclass from itself, its fields as a dict (checked: SettingsError), or None (defaults)."""
    if obj is None:
        return cls()
    if not isinstance(obj, dict):
        return obj
    try:
        return cls(**obj)
    except TypeError as e:
        raise SettingsError(f"bad {cls.__name__}: {e}") from None


class ProtocolError(ValueError):
    """A line that is not a valid message."""


class EngineRequestError(KnownError):
    """A request the engine refuses or cannot finish, and the kind of Error it answers with (the
    receivers branch on `kind`: a 'context' error is the server's 400, 'overloaded' its 503)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind

    def event(self, rid: str | None) -> Error:
        return Error(kind=self.kind, id=rid, message=str(self))


def error_kind(e: BaseException, default: ErrorKind = "generate") -> ErrorKind:
    """The kind of Error an exception answers a request with."""
    return e.kind if isinstance(e, EngineRequestError) else default


def encode(msg: Message) -> str:
    """One JSON line (ending in a newline) for a request or an event.

    Text that is not valid Unicode (lone surrogates, as Python decodes invalid UTF-8 or binary
    input with `surrogateescape`) is replaced by U+FFFD here, so the line can always be written.
    """
    # Not dataclasses.asdict: it copies every nested list and dict in Python recursion, and a 600-deep
    # tool-call argument made it raise RecursionError where json's own encoder manages (issue 34).
    # Raises ValueError (or TypeError) for what cannot be a JSON line; the client turns that into
    # an error for the one request.
    try:
        line = json.dumps({"type": msg.TYPE, **fields_of(msg)}, ensure_ascii=False, default=_plain) + "\n"
    except RecursionError:
        raise ValueError(f"a {msg.TYPE} message is nested too deeply to be sent") from None
    return _SURROGATES.sub("\ufffd", line)


def _plain(obj: Any) -> Any:
    """json.dumps's fallback: a settings dataclass inside a message becomes its fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return fields_of(obj)
    raise TypeError(f"{type(obj).__name__} cannot be sent to the engine")


def decode_event(line: str | bytes) -> Event:
    """decode() for the client side: a request coming back from the engine is a protocol error."""
    msg = decode(line)
    if isinstance(msg, (Load, Generate, Embed, Tokenize, Cancel, Unload, Shutdown, Ping)):
        raise ProtocolError(f"not an event: {msg.TYPE}")
    return msg


_TYPE = re.compile(r'\s*\{\s*"type"\s*:\s*"([a-z]{1,20})"')


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    """The validator of one message class, built from its annotations. A field the class does not
    have is an error (both sides are the same version: it is a bug, not news)."""
    if "__pydantic_config__" not in cls.__dict__:
        cls.__pydantic_config__ = ConfigDict(extra="forbid")
    return TypeAdapter(cls)


# Built at import (about 0.1 s), not on first use: pydantic imports parts of itself lazily, and an
# MCP client thread importing pydantic at the same moment as a first decode met a half-initialised
# pydantic module (ImportError) in the session tests.
_ADAPTERS: Final[dict[str, TypeAdapter[Any]]] = {kind: _adapter(cls) for kind, cls in _ALL.items()}


def decode(line: str | bytes) -> Message:
    """Parse one JSON line back into its dataclass, every field checked against its annotation
    (nested settings dataclasses included, their own checks too); ProtocolError on anything else,
    naming the field."""
    text = line.decode("utf-8", "surrogateescape") if isinstance(line, bytes) else line
    kind, body = _split_type(text)
    if kind not in _ALL:
        raise ProtocolError(f"unknown message: {text[:200]!r}")
    try:
        msg: Message = _ADAPTERS[kind].validate_json(body, strict=True)
    except ValidationError as e:
        raise ProtocolError(_why(kind, e, text)) from None
    return msg


def _split_type(text: str) -> tuple[str, str]:
    """(the message's type, the JSON object without it). encode() writes the type first, so that is
    cut from the text; a peer that put it elsewhere takes the slow way (parsed and written again)."""
    m = _TYPE.match(text)
    if m:
        rest = text[m.end():].lstrip()
        return m.group(1), "{" + (rest[1:] if rest.startswith(",") else rest)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"not JSON: {text[:200]!r}") from e
    kind = data.pop("type", None) if isinstance(data, dict) else None
    if not isinstance(kind, str):
        raise ProtocolError(f"unknown message: {text[:200]!r}")
    return kind, json.dumps(data)


def _why(kind: str, e: ValidationError, text: str) -> str:
    """A ValidationError in a sentence that names the field."""
    first = e.errors(include_url=False)[0]
    if first["type"] in ("json_invalid", "recursion_loop"):
        return f"not JSON: {text[:200]!r}"
    where = ".".join(str(part) for part in first["loc"]) or "message"
    value = "" if first["type"] == "missing" else f" (got {str(first.get('input'))[:50]!r})"
    more = f" and {e.error_count() - 1} more" if e.error_count() > 1 else ""
    return f"bad {kind} message: {where}: {first['msg']}{value}{more}"
