"""The batched engine: many requests on one context, one `llama_decode` per step (continuous batching).

Each step (nano-vllm's shape: schedule, one forward pass, postprocess) decodes one token for
every running sequence plus at most one prefill chunk (engine/batching/scheduler.py), logits only for
the rows that are sampled. Requests join and leave between steps. A request alone on the
engine runs speculative decoding as before (verification is a batch of [last] + draft on its
own sequence); while several run, drafting pauses (bench/batch.py measured why).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.batching.generate import Drafter, Generator, RunStats, llama_perf, make_sampler
from ggufdesk.engine.structured.grammar import GrammarConstraint
from ggufdesk.engine.structured.reasoning import ReasoningControl
from ggufdesk.engine.structured.request import Structured
from ggufdesk.engine.runtime.native import LoadedModel
from ggufdesk.engine.batching.disk_cache import DiskCache
from ggufdesk.engine.batching.prefix_cache import Slot, Slots
from ggufdesk.engine.batching.scheduler import Overloaded, Scheduler
from ggufdesk.engine.batching.shift import ContextUse, room_needed, shift
from ggufdesk.engine.batching.text import TextStream

log = logging.getLogger("ggufdesk.engine")

STATS_EVERY_S = 0.25
STATUS_EVERY_S = 0.25


@dataclass(eq=False)
class Sequence:
    """One request from admission to Done: its prompt, sampler, text stream and stats."""

    rid: str
    prompt: list[int]
    sampling: SamplingSettings
    max_gen: int  # max_tokens, clipped to the room the context leaves
    logprobs: int = 0
    drafter: Drafter | None = None
    stats: RunStats = field(default_factory=RunStats)
    slot: Slot | None = None
    sampler: internals.LlamaSampler | None = None
    stream: TextStream | None = None
    n_done: int = 0  # prompt tokens in the KV cache
    last: int = -1  # the sampled token not yet in the KV cache
    pieces: list[str] = field(default_factory=list)  # the answer's text
    thoughts: list[str] = field(default_factory=list)  # a reasoning model's thinking
    pending_lp: list[dict[str, Any]] = field(default_factory=list)
    next_stats: float = 0.0
    alone: bool = True  # never shared a step with another request (then llama_perf is its own)
    constraint: GrammarConstraint | None = None  # structured output: every token must fit its grammar
    structured: Structured | None = None  # what the request asked for (tool calls are parsed at the end)
    reasoning: ReasoningControl | None = None  # a reasoning model: its split and budget
    paused_steps: int = 0  # steps decoded in a batch while it had a drafter
    ctx: ContextUse = field(default_factory=ContextUse)  # overflow policy, what it dropped, what it restored
    deadline: float | None = None  # BatchEngine.clock() time past which the request is ended (Generate.deadline_s)
    limit_s: float | None = None  # the deadline_s it came with (for the message)

    @property
    def reserve(self) -> int:
        n = len(self.prompt) + self.max_gen
        return min(n, self.ctx.cells) if self.ctx.cells else n

    @property
    def prefilling(self) -> bool:
        return self.n_done < len(self.prompt)


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


class BatchEngine:
    """Runs every admitted request of one loaded model, step by step.

    emit: sends an event. cancelled(rid): whether rid was cancelled. set_batch(rids): tells the
    cancel book which requests the next decode call serves (a cancel of one of them aborts it).
    on_plain_done(stats): a request that ran alone without speculation ended (its final Stats).
    flush(): sends the events emitted so far in this step (called before each decode call, so what the
    step decided before computing, such as a cancel's Done, does not wait for the computation).
    """

    def __init__(self, lm: LoadedModel, gen: Generator, *, emit: Callable[[Any], None],
                 cancelled: Callable[[str], bool], set_batch: Callable[[list[str]], None],
                 on_plain_done: Callable[[P.Stats], None] | None = None, spec_label: str = "off",
                 flush: Callable[[], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 disk: DiskCache | None = None) -> None:
        s = lm.settings
        self.clock = clock  # for request deadlines
        self.lm, self.gen, self.emit, self.flush = lm, gen, emit, flush
        self.cancelled, self.set_batch, self.on_plain_done = cancelled, set_batch, on_plain_done
        self.spec_label = spec_label
        self.n_ctx = lm.n_ctx  # each sequence may grow to the whole context (unified KV cache)
        self.n_parallel = s.n_parallel
        self.n_batch = s.n_batch
        self.mem = Memory(lm)
        self.slots = Slots(s.n_parallel, lm.n_ctx, self.mem, n_swa=int(llama_cpp.llama_model_n_swa(lm.model.model)))
        self.sched: Scheduler[Sequence] = Scheduler(n_slots=s.n_parallel, n_cells=lm.n_ctx, n_batch=s.n_batch,
                                                    prefill_chunk=s.prefill_chunk)
        self._batch = internals.LlamaBatch(n_tokens=max(s.n_batch, lm.n_outputs, 1), embd=0, n_seq_max=1)
        self._status_sent: tuple | None = None
        self._status_t = 0.0
        self.disk = disk  # the disk prompt cache (engine/batching/disk_cache.py), None when off

    # ---- requests -----------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue a request (KnownError kind 'context' if it can never fit, 'overloaded' if the queue is full)."""
        if len(seq.prompt) >= self.n_ctx:
            raise context_error(len(seq.prompt), self.n_ctx - 1)
        try:
            self.sched.submit(seq)
        except Overloaded as e:
            err = KnownError(str(e))
            err.kind = "overloaded"  # type: ignore[attr-defined]
            raise err from None
        self._status(force=False)

    @property
    def busy(self) -> bool:
        return self.sched.busy

    def cancel_all(self, reason: str = "cancelled") -> None:
        """End every request (unload, load, shutdown while busy)."""
        for seq in list(self.sched.running) + list(self.sched.waiting):
            self._finish(seq, reason)
        self._status(force=True)

    def fail_all(self, message: str, detail: str = "") -> None:
        """A bug in a step: end every request with an error and start from an empty cache."""
        for seq in list(self.sched.running) + list(self.sched.waiting):
            self._release(seq)
            self.emit(P.Error(kind="bug", id=seq.rid, message=message, detail=detail))
        self.mem.clear()
        self.slots.reset()
        self._status(force=True)

    def idle(self) -> None:
        """Nothing left to run: send the final Status now (the throttle may have held it back)."""
        self._status(force=True)

    # ---- the step -----------------------------------------------------------------------------

    def step(self) -> None:
        """One engine step: reap cancelled and expired, admit, one llama_decode, sample, emit."""
        now = self.clock()
        for seq in list(self.sched.running) + list(self.sched.waiting):
            if self.cancelled(seq.rid):
                self._finish(seq, "cancelled")
            elif seq.deadline is not None and now >= seq.deadline:
                self._expire(seq)
        for seq in self.sched.admit():
            self._start(seq)
        plan = self.sched.plan()
        if not plan.decode and plan.prefill is None:
            self._status(force=True)
            return
        for seq in plan.decode:
            if seq.ctx.shifting and room_needed(seq.slot, 1, self.n_ctx):
                self._shift(seq)
        alone = len(self.sched.running) == 1
        if not alone:
            for s in self.sched.running:
                s.alone = False
        try:
            if alone and plan.prefill is None and plan.decode[0].drafter is not None:
                self._speculative_step(plan.decode[0])
            else:
                t0 = time.perf_counter()
                n_prompt = self._batch_step(plan.decode, plan.prefill, plan.chunk)
                if n_prompt is not None and self.sched.sizer is not None:
                    self.sched.sizer.observe(len(plan.decode), n_prompt, time.perf_counter() - t0)
        except KnownError as e:
            for seq in plan.decode + ([plan.prefill] if plan.prefill else []):
                self._fail(seq, e)
        self._status(force=False)

    def _start(self, seq: Sequence) -> None:
        """Admitted: take a slot holding the longest cached prefix, make the sampler."""
        seq.slot, seq.stats.n_reused = self.slots.acquire(seq.prompt)
        if self.disk is not None:
            seq.ctx.restored = self.disk.restore(self.slots, seq.slot, seq.prompt)
            seq.stats.n_reused = len(seq.slot.tokens)
        seq.n_done = seq.stats.n_reused
        if len(self.sched.running) == 1:
            llama_cpp.llama_perf_context_reset(self.lm.ctx.ctx)
        seq.sampler = make_sampler(self.lm, seq.sampling)
        seq.stream = TextStream(seq.sampling.stop)
        s = seq.sampling
        if seq.sampler is not None and s.repeat_penalty != 1.0 and s.repeat_last_n:
            for t in seq.prompt[-max(s.repeat_last_n, 0):]:
                seq.sampler.accept(t)

    def _fill(self, rows: list[tuple[int, int, int, bool]]) -> None:
        fill_batch(self._batch, rows)

    def _decode(self, rows: list[tuple[int, int, int, bool]], seqs: list[Sequence], *, abortable: bool) -> bool:
        """One llama_decode; False if it was aborted by a cancel (the batch is rolled back)."""
        if not self.slots.evict(len(rows)):
            raise KnownError("the KV cache is full")  # the scheduler's reservations make this a bug
        self._fill(rows)
        if self.flush is not None:
            self.flush()
        self.set_batch([s.rid for s in seqs])
        if abortable:
            self.lm.abortable(True)
        try:
            rc = llama_cpp.llama_decode(self.lm.ctx.ctx, self._batch.batch)
        finally:
            if abortable:
                self.lm.abortable(False)
            self.set_batch([])
        if rc == 2:
            for s in seqs:  # whatever micro-batches landed before the abort are dropped
                self.mem.seq_rm(s.slot.seq, len(s.slot.tokens), -1)
            return False
        if rc == 1:
            raise KnownError(f"the context is full ({self.n_ctx} cells)")
        if rc != 0:
            raise KnownError(f"llama_decode failed with code {rc}")
        return True

    def _batch_step(self, decode: list[Sequence], prefill: Sequence | None, chunk: int) -> int | None:
        """Decode one token for each of `decode` and up to `chunk` prompt tokens of `prefill`;
        returns how many prompt tokens it evaluated (None: a cancel aborted the step)."""
        rows: list[tuple[int, int, int, bool]] = []
        for s in decode:
            rows.append((s.last, len(s.slot.tokens), s.slot.seq, True))
            if s.drafter is not None:
                s.paused_steps += 1
        part: list[int] = []
        completes = False
        if prefill is not None:
            start = prefill.n_done
            part = prefill.prompt[start:start + chunk]
            completes = start + len(part) == len(prefill.prompt)
            p0 = len(prefill.slot.tokens)
            for i, t in enumerate(part):
                rows.append((t, p0 + i, prefill.slot.seq, completes and i == len(part) - 1))
        seqs = decode + ([prefill] if prefill else [])
        if not self._decode(rows, seqs, abortable=bool(part) and len(part) > 1):
            return None
        for s in decode:
            self.slots.extend(s.slot, [s.last])
        if prefill is not None:
            self.slots.extend(prefill.slot, part)
            prefill.n_done += len(part)
            base = prefill.stats.n_reused
            self.emit(P.Progress(id=prefill.rid, phase="prefill", done=prefill.n_done - base,
                                 total=len(prefill.prompt) - base))
        for i, s in enumerate(decode):
            self._take(s, self._sample(s, i))
        if completes:
            prefill.stats.t_prefill_end = time.perf_counter()
            if self.disk is not None:
                self.disk.prefilled(prefill.slot)
            self._take(prefill, self._sample(prefill, len(rows) - 1))
        return len(part)

    def _speculative_step(self, s: Sequence) -> None:
        """A request alone: draft, verify [last] + draft in one batch, keep the matching part
        (docs/architecture.md, "The decode loop")."""
        drafter, slot = s.drafter, s.slot
        n0 = len(slot.tokens)
        room = self.n_ctx - n0 - 1
        k = min(drafter.k, room - 1, s.max_gen - s.stats.n_gen - 1, self.lm.n_outputs - 1, self.n_batch - 1)
        t_step = time.perf_counter()
        draft = drafter.propose(slot.tokens, s.last, k)[:k] if k > 0 else []
        if self.cancelled(s.rid):
            return  # drafting took a while: the next step ends it
        toks = [s.last] + draft
        rows = [(t, n0 + i, slot.seq, True) for i, t in enumerate(toks)]
        if not self._decode(rows, [s], abortable=len(toks) > 1):
            return
        self.slots.extend(slot, toks)
        out: list[int] = []
        for i in range(len(toks)):
            t = self._sample(s, i)
            out.append(t)
            if i == len(draft) or t != draft[i]:
                break
        self.slots.truncate(slot, n0 + len(out))  # keep last + the accepted part of the draft
        n_acc = len(out) - 1 if draft else 0
        st = s.stats
        st.drafted += len(draft)
        st.accepted += n_acc
        drafter.feedback(len(draft), n_acc, time.perf_counter() - t_step)
        st.draft_len, st.speculation = drafter.k, drafter.status
        for t in out:
            if not self._take(s, t):
                break

    # ---- sampling and output ------------------------------------------------------------------

    def _sample(self, s: Sequence, row: int) -> int:
        free = s.constraint is None or s.constraint.awaiting  # an active grammar decides every token
        forced = s.reasoning.forced() if s.reasoning is not None and free else None
        if forced is not None:  # the reasoning budget ran out: the tokens that close the block
            if s.constraint is not None:
                s.constraint.accept(forced)
            return forced
        if s.constraint is not None:  # engine/structured/grammar.py: check the sampled token, resample if rejected
            t = s.constraint.sample(self.gen.logits_row(row), s.sampler)
        else:
            t = self.gen.sample(s.sampler, row)
        if s.logprobs:
            s.pending_lp.append(self._logprob_entry(row, t, s.logprobs))
        return t

    def _logprob_entry(self, row: int, token: int, n: int) -> dict[str, Any]:
        logits = self.gen.logits_row(row)
        m = float(logits.max())
        lse = m + math.log(float(np.exp(logits - m, dtype=np.float64).sum()))
        n = min(n, len(logits))
        top = np.argpartition(-logits, n - 1)[:n]
        top = top[np.argsort(-logits[top], kind="stable")]
        return {"token": self._text(token), "logprob": float(logits[token]) - lse,
                "top": [{"token": self._text(int(i)), "logprob": float(logits[i]) - lse} for i in top]}

    def _text(self, token: int) -> str:
        return self.gen.piece(token).decode("utf-8", "replace")

    def _take(self, s: Sequence, t: int) -> bool:
        """A sampled token: emit it or finish; True while the request goes on."""
        st = s.stats
        if self.gen.is_eog(t):
            self._finish(s, "stop")
            return False
        st.n_gen += 1
        st.tokens.append(t)
        now = time.perf_counter()
        st.t_first = st.t_first or now
        st.t_last = now
        self._text_out(s, s.stream.push(self.gen.piece(t)))
        if s.stream.stopped:
            self._finish(s, "stop")
            return False
        if st.n_gen >= s.max_gen:
            self._finish(s, "length")
            return False
        s.last = t
        if now >= s.next_stats:
            self.emit(self._stats(s, final=False))
            s.next_stats = now + STATS_EVERY_S
        return True

    def _text_out(self, s: Sequence, text: str, *, final: bool = False) -> None:
        if s.reasoning is not None:  # a reasoning model: its thinking and its answer apart
            parts = s.reasoning.take(text) if text else []
            for is_reasoning, piece in parts + (s.reasoning.finish() if final else []):
                self._emit_text(s, piece, is_reasoning)
        elif text:
            self._emit_text(s, text, False)

    def _emit_text(self, s: Sequence, text: str, reasoning: bool) -> None:
        (s.thoughts if reasoning else s.pieces).append(text)
        lp, s.pending_lp = (s.pending_lp or None), []
        self.emit(P.Token(id=s.rid, text=text, logprobs=lp if s.logprobs else None, reasoning=reasoning))

    def _stats(self, s: Sequence, *, final: bool) -> P.Stats:
        st = s.stats
        spec = st.speculation if s.drafter is None else s.drafter.status
        if s.structured is not None and s.structured.active:
            spec = "off: grammar"
        if s.paused_steps:
            spec = "paused" if not st.drafted else f"{spec}, paused while batched"
        return P.Stats(
            id=s.rid, n_prompt=st.n_prompt, n_reused=st.n_reused, n_gen=st.n_gen,
            ttft_s=round(st.ttft_s, 4), prefill_tok_s=round(st.prefill_tok_s, 2),
            decode_tok_s=round(st.decode_tok_s, 2), drafted=st.drafted, accepted=st.accepted,
            draft_len=st.draft_len, speculation=spec, final=final,
            llama_perf=(llama_perf(self.lm) if s.alone else {}) if final else {},
        )

    def _release(self, s: Sequence) -> None:
        self.sched.remove(s)
        if s.sampler is not None:
            s.sampler.close()
            s.sampler = None
        if s.constraint is not None:
            s.constraint.close()
            s.constraint = None
        if s.slot is not None:
            # keep the KV for later prefixes; a request that stopped mid-prompt leaves a partial one
            if s.slot.exact is not None:  # after a context shift only the part before it is exact
                self.slots.truncate(s.slot, s.slot.exact)
            self.slots.release(s.slot)
            s.slot = None

    def _finish(self, s: Sequence, reason: str) -> None:
        started, slot = s.slot is not None, s.slot
        self._release(s)
        if self.disk is not None and slot is not None:
            self.disk.finished(slot)
        if reason == "cancelled":
            self.emit(P.Done(id=s.rid, finish_reason="cancelled", text="".join(s.pieces), tokens=s.stats.tokens,
                             reasoning="".join(s.thoughts) if s.reasoning is not None else None,
                             usage=usage(s), overflow=s.ctx.applied))
            return
        if s.stream is not None:
            self._text_out(s, s.stream.flush(), final=True)
        st = s.stats
        final = self._stats(s, final=True)
        self.emit(final)
        text = "".join(s.pieces)
        parsed = s.structured.parse(text) if s.structured is not None else None
        calls = parsed.calls if parsed is not None else []
        if calls and reason == "stop":
            reason = "tool_calls"
        self.emit(P.Done(id=s.rid, finish_reason=reason, text=text, tokens=st.tokens, usage=usage(s),
                         overflow=s.ctx.applied, tool_calls=calls,
                         content=parsed.content if calls and parsed is not None else None,
                         stop=s.stream.matched if s.stream is not None and reason == "stop" else None,
                         reasoning="".join(s.thoughts) if s.reasoning is not None else None,
                         warnings=parsed.warnings if parsed is not None else []))
        if started and s.alone and s.drafter is None and self.on_plain_done is not None:
            self.on_plain_done(final)  # the figures the user saw

    def _expire(self, s: Sequence) -> None:
        """Past its deadline: end it with a timeout error (what it produced so far has been streamed)."""
        if s.stream is not None:
            self._text_out(s, s.stream.flush())
        self._release(s)
        self.emit(P.Error(kind="timeout", id=s.rid, message=(
            f"the request was stopped after {s.limit_s:g} s ({s.stats.n_gen} tokens generated): it took "
            "longer than the engine allows it (ggufdesk serve --request-timeout)")))

    def _fail(self, s: Sequence, e: KnownError) -> None:
        slot = s.slot
        self._release(s)
        if slot is not None:
            self.slots.clear(slot)  # what a failed decode left there is not to be trusted
        self.emit(P.Error(kind=getattr(e, "kind", "generate"), id=s.rid, message=str(e)))

    # ---- the context ---------------------------------------------------------------------------

    def _shift(self, s: Sequence) -> None:
        """A `shift` request at the context's edge: drop its oldest tokens after the system prompt."""
        if shift(self.slots, s.slot, s.ctx, self.n_ctx):
            self.emit(self.overflow_event(s))

    def overflow_event(self, s: Sequence) -> P.Overflow:
        c = s.ctx
        return P.Overflow(id=s.rid, policy=c.applied or c.policy, truncated_tokens=c.truncated,
                          dropped_messages=c.dropped_messages, n_ctx=self.n_ctx, note=c.note)

    # ---- status -------------------------------------------------------------------------------

    def spec_mode(self) -> str:
        with_drafter = [s for s in self.sched.running if s.drafter is not None]
        if not with_drafter:
            return "off"
        if len(self.sched.running) > 1:
            return "paused"
        return with_drafter[0].drafter.status

    def _status(self, *, force: bool) -> None:
        """Status when it changed: at most every STATUS_EVERY_S while busy, at once when idle."""
        now = time.monotonic()
        state = (len(self.sched.running), len(self.sched.waiting), self.slots.used, self.spec_mode())
        if state == self._status_sent:
            return
        if not force and now - self._status_t < STATUS_EVERY_S and self._status_sent is not None:
            return
        self._status_sent, self._status_t = state, now
        running, queued, used, spec = state
        self.emit(P.Status(running=running, queued=queued, kv_cells_used=used, kv_cells_total=self.n_ctx,
                           n_parallel=self.n_parallel, spec=spec))


def fill_batch(batch: internals.LlamaBatch, rows: list[tuple[int, int, int, bool]]) -> None:
    """rows: (token, position, sequence id, wants logits)."""
    b = batch.batch
    for i, (tok, pos, sid, out) in enumerate(rows):
        b.token[i] = tok
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = sid
        b.logits[i] = out
    b.n_tokens = len(rows)


def usage(s: Sequence) -> dict[str, int]:
    """A Done's usage: token counts, what came from a cache, what the overflow policy dropped."""
    st, c = s.stats, s.ctx
    out = {"prompt_tokens": st.n_prompt, "completion_tokens": st.n_gen, "cached_tokens": st.n_reused,
           "restored_tokens": c.restored, "truncated_tokens": c.truncated}
    if s.reasoning is not None:
        out["reasoning_tokens"] = s.reasoning.tokens
    return out


def context_error(n: int, room: int) -> KnownError:
    e = KnownError(f"the prompt is {n} tokens but the context has room for {room}; "
                   "shorten it or load the model with a larger context")
    e.kind = "context"  # type: ignore[attr-defined]
    return e
