"""One request in the step loop: what it asked for, its lifecycle status and its running figures.

A sequence's state is one field, `status` (vLLM v1's `RequestStatus`, llama.cpp server's
`slot_state`), never inferred from which list holds it or whether it has a slot:

    WAITING -> PREFILLING -> DECODING <-> VERIFYING -> FINISHED_* (or FAILED, EXPIRED)

VERIFYING is a step in which the sequence's row carries draft rows (engine/speculation/planner.py);
the update after the step puts it back to DECODING or finishes it. Every finished status maps to
the protocol's finish reason (`finish_reason`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.batching.shift import ContextUse
from ggufdesk.engine.link import protocol as P

if TYPE_CHECKING:
    from llama_cpp import _internals as internals

    from ggufdesk.engine.batching.media import MediaPrompt
    from ggufdesk.engine.batching.prefix_cache import Slot
    from ggufdesk.engine.batching.text import TextStream
    from ggufdesk.engine.speculation.drafter import Drafter
    from ggufdesk.engine.structured.grammar import GrammarConstraint
    from ggufdesk.engine.structured.reasoning import ReasoningControl
    from ggufdesk.engine.structured.request import Structured


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued: no slot yet
    PREFILLING = "prefilling"  # has a slot; prompt tokens still to evaluate
    DECODING = "decoding"  # one row per step
    VERIFYING = "verifying"  # this step: its row and its draft rows
    FINISHED_STOP = "stop"  # end of generation or a stop string (tool calls are told at the end)
    FINISHED_LENGTH = "length"  # max_tokens
    FINISHED_CONTEXT = "context"  # the context has no room for another token
    FINISHED_CANCELLED = "cancelled"
    FAILED = "failed"  # an Error ended it, not a Done
    EXPIRED = "expired"  # past its deadline: an Error of kind "timeout" ended it

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset({SequenceStatus.FINISHED_STOP, SequenceStatus.FINISHED_LENGTH,
                       SequenceStatus.FINISHED_CONTEXT, SequenceStatus.FINISHED_CANCELLED, SequenceStatus.FAILED,
                       SequenceStatus.EXPIRED})
FINISH_REASONS: dict[SequenceStatus, P.FinishReason] = {
    SequenceStatus.FINISHED_STOP: "stop", SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_CONTEXT: "context", SequenceStatus.FINISHED_CANCELLED: "cancelled",
}


@dataclass
class RunStats:
    """A request's figures as it runs (sent in Stats events)."""

    n_prompt: int = 0
    n_reused: int = 0
    n_gen: int = 0
    t_start: float = 0.0
    t_prefill_end: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    drafted: int = 0
    accepted: int = 0
    draft_len: int = 0
    drafts: int = 0
    speculation: str = "off"
    tokens: list[int] = field(default_factory=list)

    @property
    def ttft_s(self) -> float:
        return max(0.0, self.t_first - self.t_start) if self.t_first else 0.0

    @property
    def prefill_tok_s(self) -> float:
        n = self.n_prompt - self.n_reused
        dt = self.t_prefill_end - self.t_start
        return n / dt if n > 0 and dt > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        dt = self.t_last - self.t_first
        return (self.n_gen - 1) / dt if self.n_gen > 1 and dt > 0 else 0.0


@dataclass(eq=False)
class Sequence:
    """One request from admission to its Done (or Error)."""

    # what the request asked for
    rid: str
    prompt: list[int]
    sampling: SamplingSettings
    max_gen: int  # max_tokens, clipped to the room the context leaves
    logprobs: int = 0
    drafter: Drafter | None = None
    constraint: GrammarConstraint | None = None  # structured output: every token must fit its grammar
    structured: Structured | None = None  # what the request asked for (tool calls are parsed at the end)
    reasoning: ReasoningControl | None = None  # a reasoning model: its split and budget
    chat: bool = False  # an answer in a chat (not a text continued): no whitespace at its ends
    deadline: float | None = None  # BatchEngine.clock() time past which the request is ended (Generate.deadline_s)
    limit_s: float | None = None  # the deadline_s it came with (for the message)
    bias: tuple[Any, Any] | None = None  # logit bias: token ids and what to add to their logits (-inf: never)
    reuse: bool = True  # a cached prefix may be reused (Generate.cache_prompt)
    watched: bool = True  # its tokens are read as they come (Generate.stream): its steps must stay short
    ctx: ContextUse = field(default_factory=ContextUse)  # overflow policy, what it dropped, what it restored
    media: MediaPrompt | None = None  # a prompt with images: each image span is one prefill item
    stats: RunStats = field(default_factory=RunStats)
    # its state in the loop
    status: SequenceStatus = SequenceStatus.WAITING
    slot: Slot | None = None  # its KV sequence, from admission to the end
    sampler: internals.LlamaSampler | None = None
    stream: TextStream | None = None
    n_done: int = 0  # prompt tokens in the KV cache
    last: int = -1  # the sampled token not yet in the KV cache (DECODING, VERIFYING)
    forced: list[int] = field(default_factory=list)  # tokens to write next instead of sampling (`force`)
    pieces: list[str] = field(default_factory=list)  # the answer's text
    thoughts: list[str] = field(default_factory=list)  # a reasoning model's thinking
    pending_lp: list[dict[str, Any]] = field(default_factory=list)
    next_stats: float = 0.0
    alone: bool = True  # never shared a step with another request (then llama_perf is its own)

    @property
    def reserve(self) -> int:
        """KV cells it may need in all: prompt + tokens it may still generate (a shifting one: the context at most)."""
        n = len(self.prompt) + self.max_gen
        return min(n, self.ctx.cells) if self.ctx.cells else n

    @property
    def prompt_left(self) -> int:
        """Prompt tokens not yet in the KV cache."""
        return len(self.prompt) - self.n_done

    @property
    def kv_end(self) -> int:
        """The KV position of its next token: prompt + generated, less what context shifts dropped."""
        return len(self.prompt) + self.stats.n_gen - self.ctx.shifted

    def force(self, tokens: list[int]) -> None:
        """Write `tokens` next, as if sampled, then sample on (a hook: a reasoning budget closing a
        think block). They are taken like sampled ones (text, stops, max_tokens) at the next step."""
        self.forced.extend(tokens)
