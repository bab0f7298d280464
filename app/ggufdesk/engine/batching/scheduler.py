"""Which sequences run in the next engine step: FIFO admission by free KV cells, prompt chunks under a budget.

A request is admitted when a sequence slot is idle and its prompt plus the tokens it may still
generate fit the cells that running requests have not reserved; otherwise it waits in a bounded
FIFO queue (full queue: `Overloaded`). Admission is strictly first come, first served, so a big
request at the head is never starved by small ones behind it. Each step decodes one token for
every running sequence and prefills prompt tokens up to a budget: while others are decoding, as many
as engine/batching/chunking.py says fit beside them (or a fixed `prefill_chunk`), so their next token is
never far away; a whole `n_batch` when nobody is waiting for a token: no sequence decodes, or only
those whose answers nobody reads until they end (non-streaming requests, `watched` False), for which
fewer, larger steps finish sooner (bench/burst.py). The budget goes to the prompts in admission order:
one that ends within it leaves the rest to the next (four short prompts waiting together are read in
one step, as llama-server reads them, instead of one a step). Beside decoding streams the budget stays
the sizer's: prompts that arrive while a stream decodes are still read a chunk a step
(docs/bench/speculative-decoding.md, sessions 40 and 41).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ggufdesk.engine.batching.chunking import ChunkSizer
from ggufdesk.engine.batching.sequence import SequenceStatus

QUEUE_PER_SLOT = 16  # queued requests allowed per sequence slot before new ones are refused
MIN_QUEUE = 16


class Schedulable(Protocol):
    status: SequenceStatus  # set to PREFILLING here at admission; the loop moves it on from there
    watched: bool  # someone reads its tokens as they come (a stream): steps beside it stay short

    @property
    def reserve(self) -> int: ...  # KV cells it may need in all: prompt + tokens it may still generate

    @property
    def prompt_left(self) -> int: ...  # prompt tokens not yet in the KV cache

    n_done: int  # prompt tokens in the KV cache: where its next chunk starts (deeper tokens cost more)


S = TypeVar("S", bound=Schedulable)


class Overloaded(Exception):
    """The queue is full: the request is refused now (try again later)."""


@dataclass
class DecodeRow(Generic[S]):
    """A running sequence's part of a step: its last sampled token, then any forced tokens (taken
    as written) and draft tokens (verified), all at its next positions."""

    seq: S
    forced: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)
    pad: int = 0  # of the draft, filler rows at its end that keep the step's shape (engine/speculation/planner.py)

    @property
    def rows(self) -> int:
        return 1 + len(self.forced) + len(self.draft)


@dataclass
class Prefill(Generic[S]):
    """A prompting sequence's part of a step: its next n prompt tokens."""

    seq: S
    n: int

    @property
    def completes(self) -> bool:
        """Whether this part ends the prompt (its last row's logits give the first token)."""
        return self.n == self.seq.prompt_left


@dataclass
class Plan(Generic[S]):
    """What one step computes (engine/batching/batch.py): a row per running sequence (plus its draft
    rows, engine/speculation/planner.py) and the prompt chunks of those still reading their prompts."""

    decode: list[DecodeRow[S]]
    prefills: list[Prefill[S]] = field(default_factory=list)
    image: Any = None  # instead of a text chunk, an image of the first prompt (engine/batching/media.py ImageSpan)

    @property
    def prefill(self) -> S | None:
        """The first prompting sequence (the one an image step serves)."""
        return self.prefills[0].seq if self.prefills else None

    @property
    def chunk(self) -> int:
        """Prompt tokens in this step, all prompts together."""
        return sum(p.n for p in self.prefills)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefills

    @property
    def decode_rows(self) -> int:
        return sum(r.rows for r in self.decode)

    def sequences(self) -> list[S]:
        return [r.seq for r in self.decode] + [p.seq for p in self.prefills]


class Scheduler(Generic[S]):
    """The waiting queue and the running set of one context."""

    def __init__(self, *, n_slots: int, n_cells: int, n_batch: int, prefill_chunk: int,
                 max_queue: int | None = None) -> None:
        self.n_slots, self.n_cells, self.n_batch = n_slots, n_cells, n_batch
        self.prefill_chunk = prefill_chunk  # 0: sized by measured step times (self.sizer)
        self.sizer = ChunkSizer(n_batch=n_batch) if prefill_chunk == 0 else None
        self.max_queue = max_queue if max_queue is not None else max(MIN_QUEUE, QUEUE_PER_SLOT * n_slots)
        self.waiting: deque[S] = deque()
        self.running: list[S] = []

    @property
    def reserved(self) -> int:
        return sum(s.reserve for s in self.running)

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def submit(self, seq: S) -> None:
        """Queue a request; raises Overloaded when the queue is full."""
        if len(self.waiting) >= self.max_queue:
            raise Overloaded(f"the engine is busy: {len(self.running)} requests running and "
                             f"{len(self.waiting)} waiting; try again later")
        self.waiting.append(seq)

    def admit(self) -> list[S]:
        """Move requests from the head of the queue to running while a slot and their cells are free."""
        started = []
        while self.waiting and len(self.running) < self.n_slots:
            head = self.waiting[0]
            if self.running and self.reserved + head.reserve > self.n_cells:
                break  # strictly FIFO: wait for cells rather than let later requests pass
            self.running.append(self.waiting.popleft())
            head.status = SequenceStatus.PREFILLING
            started.append(head)
        return started

    def remove(self, seq: S) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def plan(self) -> Plan[S]:
        """The next step: a row for every running sequence, plus prompt chunks under the token budget."""
        decode = [DecodeRow(s) for s in self.running
                  if s.status is SequenceStatus.DECODING or s.status is SequenceStatus.VERIFYING]
        reading = [s for s in self.running if s.status is SequenceStatus.PREFILLING]
        if not reading:
            return Plan(decode=decode)
        if not any(r.seq.watched for r in decode):  # nobody waits for a next token: the whole batch
            budget = self.n_batch
        elif self.sizer is not None:
            budget = self.sizer.chunk(len(decode), reading[0].n_done)
        else:
            budget = self.prefill_chunk
        room = max(0, min(budget, self.n_batch - len(decode)))
        prefills = []
        for s in reading:  # in admission order: the first is never passed by a later one
            n = min(room, s.prompt_left)
            if n <= 0:
                break
            prefills.append(Prefill(s, n))
            room -= n
        return Plan(decode=decode, prefills=prefills)
