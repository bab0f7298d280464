"""The model runner: a step's plan into one `llama_decode`, then sampling, verification and rollback.

It fills the batch from the plan (engine/batching/scheduler.py: a row per running sequence, with
its forced and draft rows, and the prompt chunks), decodes, samples every sequence's next token,
checks draft rows (sample-and-match, docs/architecture.md "The decode loop") and removes rejected
draft rows from the KV cache, so that after a step the cache holds exactly what plain decoding
would hold. What the tokens mean (text, stops, limits) is the update's business
(engine/batching/update.py); the runner only computes.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.batching.prefix_cache import Slots
from ggufdesk.engine.batching.sampling import Sampling
from ggufdesk.engine.batching.scheduler import DecodeRow, Plan
from ggufdesk.engine.batching.sequence import Sequence
from ggufdesk.engine.runtime.native import LoadedModel

Row = tuple[int, int, int, bool]  # (token, position, sequence id, wants logits)


@dataclass
class SeqOutput:
    """What one step gave one sequence: tokens to take, in order (its forced tokens, then samples)."""

    seq: Sequence
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any] | None] = field(default_factory=list)  # one per token
    drafted: int = 0
    accepted: int = 0
    prompt_done: int = 0  # prompt tokens evaluated this step
    error: KnownError | None = None  # its sampling failed (a grammar with no way on)


@dataclass
class StepResult:
    outputs: list[SeqOutput]
    seconds: float  # the decode call and the sampling: what the step's rows cost
    rows: int  # rows in the decode call
    n_prompt: int  # of them, prompt tokens
    prompt_pos: int = 0  # the prompt tokens' positions, summed (engine/batching/chunking.py prices by position)


class Memory:
    """llama.cpp's memory calls for engine/batching/prefix_cache.py."""

    def __init__(self, lm: LoadedModel) -> None:
        self._mem = llama_cpp.llama_get_memory(lm.ctx.ctx)

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self._mem, True)

    def seq_add(self, seq: int, p0: int, p1: int, delta: int) -> None:
        llama_cpp.llama_memory_seq_add(self._mem, seq, p0, p1, delta)

    def seq_pos_min(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq))

    def can_shift(self) -> bool:
        return bool(llama_cpp.llama_memory_can_shift(self._mem))


def fill_batch(batch: internals.LlamaBatch, rows: list[Row]) -> None:
    """rows: (token, position, sequence id, wants logits)."""
    b = batch.batch
    for i, (tok, pos, sid, out) in enumerate(rows):
        b.token[i] = tok
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = sid
        b.logits[i] = out
    b.n_tokens = len(rows)


class ModelRunner:
    """Runs one step's plan on the model.

    set_batch(rids): tells the cancel book which requests the decode call serves (a cancel of one
    of them aborts it). flush(): sends the events emitted so far, just before computing.
    decode and clock are llama.cpp's decode call and the timer: tests pass a decode that also moves
    a fake clock by a modelled cost, so decisions taken on step costs do not depend on the machine.
    """

    def __init__(self, lm: LoadedModel, slots: Slots, sampling: Sampling, *,
                 set_batch: Callable[[list[str]], None], flush: Callable[[], None] | None = None,
                 decode: Callable[[Any, Any], int] = llama_cpp.llama_decode,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.lm, self.slots, self.sampling = lm, slots, sampling
        self.set_batch, self.flush, self.decode, self.clock = set_batch, flush, decode, clock
        self.n_ctx = lm.n_ctx
        self.n_decode = 0  # llama_decode calls that computed requests' rows (not images, not drafting), so far
        self.n_busy = 0  # the sequences those calls served, summed (per call: llama-server's busy slots)
        self._batch = internals.LlamaBatch(n_tokens=max(lm.settings.n_batch, lm.n_outputs, 1), embd=0, n_seq_max=1)

    def run(self, plan: Plan[Sequence]) -> StepResult | None:
        """Compute the plan; None when a cancel aborted the decode call (nothing of it is kept)."""
        rows: list[Row] = []
        bases: list[int] = []  # the batch index of each decode row's first row
        for r in plan.decode:
            bases.append(len(rows))
            rows += self._decode_rows(r)
        multi = len(rows) > len(plan.decode)  # drafts or forced tokens: a multi-row part
        if plan.image is not None:
            return self._image_step(plan, rows, bases, abortable=multi)
        parts: list[tuple[Sequence, list[int], int]] = []  # each prompt's tokens this step and its last row
        first_prompt_row = len(rows)
        for pre in plan.prefills:
            p = pre.seq
            part = p.prompt[p.n_done:p.n_done + pre.n]
            rows += self._prefill_rows(p, part)
            parts.append((p, part, len(rows) - 1))
        seqs = plan.sequences()
        n_prompt = sum(len(part) for _, part, _ in parts)
        t0 = self.clock()
        if not self._decode(rows, seqs, abortable=n_prompt > 1 or multi):
            return None
        outputs = [self._verify(r, b) for r, b in zip(plan.decode, bases)]
        outputs += [self._prefilled(p, part, last) for p, part, last in parts]
        return StepResult(outputs=outputs, seconds=self.clock() - t0, rows=len(rows), n_prompt=n_prompt,
                          prompt_pos=sum(row[1] for row in rows[first_prompt_row:]))

    def _image_step(self, plan: Plan[Sequence], rows: list[Row], bases: list[int], *,
                    abortable: bool) -> StepResult | None:
        """A step whose prefill item is an image: the decoding sequences' rows in one call (a batch
        is tokens or embeddings, not both), then the image. The step's cost is the rows' alone: the
        chunk sizer and the draft planner learn nothing from the encoder's time."""
        t0, outputs = self.clock(), []
        if rows:
            if not self._decode(rows, [r.seq for r in plan.decode], abortable=abortable):
                return None
            outputs = [self._verify(r, b) for r, b in zip(plan.decode, bases)]
        seconds = self.clock() - t0
        assert plan.prefill is not None
        outputs.append(self._image(plan.prefill, plan.image))
        return StepResult(outputs=outputs, seconds=seconds, rows=len(rows), n_prompt=0)

    def _image(self, s: Sequence, span: Any) -> SeqOutput:
        """Encode (or take from the cache) one image of s's prompt and decode its embeddings into s's
        slot, whole: an encoder that fails ends s alone; a cancel leaves nothing of it in the cache."""
        slot, media, out = s.slot, s.media, SeqOutput(seq=s)
        assert slot is not None and media is not None
        if not self.slots.evict(span.n_tokens):
            out.error = KnownError("the KV cache is full")  # the scheduler's reservations make this a bug
            return out
        if self.flush is not None:
            self.flush()
        self.set_batch([s.rid])
        self.lm.abortable(True)
        try:
            rc = media.prefill(span, n_past=len(slot.tokens), seq_id=slot.seq)
        except KnownError as e:
            rc, out.error = -1, e
        finally:
            self.lm.abortable(False)
            self.set_batch([])
        if rc == 0:
            self.slots.extend(slot, s.prompt[span.start:span.end])
            s.n_done, out.prompt_done = span.end, span.n_tokens
            return out
        self.slots.mem.seq_rm(slot.seq, len(slot.tokens), -1)  # what landed of it goes (2: a cancel)
        if rc != 2 and out.error is None:
            out.error = KnownError(f"decoding the image failed (llama_decode returned {rc})")
        return out

    # ---- filling --------------------------------------------------------------------------------

    @staticmethod
    def _decode_rows(r: DecodeRow[Sequence]) -> list[Row]:
        """[last] + forced + draft at the sequence's next positions; logits from the row whose sample
        comes next (the last forced one, else `last`) on."""
        s, slot = r.seq, r.seq.slot
        assert slot is not None
        n0, first = len(slot.tokens), len(r.forced)
        toks = [s.last, *r.forced, *r.draft]
        return [(t, n0 + i, slot.seq, i >= first) for i, t in enumerate(toks)]

    @staticmethod
    def _prefill_rows(s: Sequence, part: list[int]) -> list[Row]:
        assert s.slot is not None
        completes = s.n_done + len(part) == len(s.prompt)
        p0 = len(s.slot.tokens)
        return [(t, p0 + i, s.slot.seq, completes and i == len(part) - 1) for i, t in enumerate(part)]

    def _decode(self, rows: list[Row], seqs: list[Sequence], *, abortable: bool) -> bool:
        """One llama_decode; False if a cancel aborted it (what landed is rolled back)."""
        if not self.slots.evict(len(rows)):
            raise KnownError("the KV cache is full")  # the scheduler's reservations make this a bug
        fill_batch(self._batch, rows)
        if self.flush is not None:
            self.flush()
        self.set_batch([s.rid for s in seqs])
        if abortable:
            self.lm.abortable(True)
        try:
            rc = self.decode(self.lm.ctx.ctx, self._batch.batch)
        finally:
            if abortable:
                self.lm.abortable(False)
            self.set_batch([])
        if rc == 2:
            for s in seqs:  # whatever micro-batches landed before the abort are dropped
                assert s.slot is not None
                self.slots.mem.seq_rm(s.slot.seq, len(s.slot.tokens), -1)
            return False
        if rc == 1:
            raise KnownError(f"the context is full ({self.n_ctx} cells)")
        if rc != 0:
            raise KnownError(f"llama_decode failed with code {rc}")
        # (A step that samples waits for the logits it reads, in sampling. One that reads none, a prompt chunk
        # alone, is timed at its launch on a GPU; only the thread tuner reads that time, the chunk sizer
        # learns from steps with decode rows. Not synchronized until a GPU run measures what waiting costs.)
        self.n_decode += 1
        self.n_busy += len(seqs)
        return True

    # ---- after the decode call ------------------------------------------------------------------

    def _verify(self, r: DecodeRow[Sequence], base: int) -> SeqOutput:
        """Sample after [last] + forced, then on through the draft while each sample matches it
        (the first mismatch is the correction; all matched: a bonus token); the KV cache keeps
        last + forced + the accepted drafts."""
        s, slot = r.seq, r.seq.slot
        assert slot is not None
        n0 = len(slot.tokens)
        self.slots.extend(slot, [s.last, *r.forced, *r.draft])
        out = SeqOutput(seq=s, tokens=list(r.forced), logprobs=[None] * len(r.forced), drafted=len(r.draft))
        for t in r.forced:
            self.sampling.accept(s, t)
        try:
            for j in range(len(r.draft) + 1):
                t, lp = self.sampling.sample(s, base + len(r.forced) + j)
                out.tokens.append(t)
                out.logprobs.append(lp)
                if j == len(r.draft) or t != r.draft[j]:
                    break
                out.accepted += 1
        except KnownError as e:
            out.error = e
        if out.accepted < len(r.draft):  # rejected draft rows leave the cache
            self.slots.truncate(slot, n0 + 1 + len(r.forced) + out.accepted)
        return out

    def _prefilled(self, s: Sequence, part: list[int], last_row: int) -> SeqOutput:
        assert s.slot is not None
        self.slots.extend(s.slot, part)
        s.n_done += len(part)
        out = SeqOutput(seq=s, prompt_done=len(part))
        if s.n_done == len(s.prompt):
            try:
                t, lp = self.sampling.sample(s, last_row)
                out.tokens, out.logprobs = [t], [lp]
            except KnownError as e:
                out.error = e
        return out
