"""The step loop: many requests on one context, one `llama_decode` per step (continuous batching).

Each step reads as nano-vllm's `LLMEngine.step` and vLLM v1's engine core do:

    plan = schedule()       reap cancels, admit, a row per running sequence + prompt chunks,
                            and draft rows for the sequences whose speculation pays (engine/speculation/planner.py)
    result = runner.run()   fill the batch, decode, sample, verify drafts, roll back the rejected
    update.apply(result)    each token judged once (engine/batching/update.py): text, stops, limits, Done

A sequence's state is its `status` (engine/batching/sequence.py). Requests join and leave between
steps; speculation runs inside batched steps, each sequence with its own drafter and controller.

Hooks for what comes next (keep them in these places):
- a per-request deadline (done: `Sequence.deadline`, read on `clock`) or any other end decided
  between steps: `_reap`;
- prompt states kept beyond the slots, in RAM and on disk (engine/batching/prompt_states.py): restored
  in `_admit`, after the slot is acquired (text-only prompts); queued when a prompt is prefilled
  (`_prefilled`, sliding-window models) or when a sequence finishes (`Update.on_finished`), saved at
  the step's end after its events went out (`_save_pending`);
- image chunks as prefill (done: engine/batching/media.py): `_images` makes an image the step's only
  prefill item (`Plan.image`) and stops a text chunk at the next image; the runner decodes it after
  the step's rows (`ModelRunner._image`); the prefix cache compares an image's span by its hash;
- context shift (engine/batching/shift.py): `_make_room`, after the plan, for the `shift` requests
  whose rows would pass the context's edge; the others end there (`Update.take`, FINISHED_CONTEXT);
- a reasoning model: its split in `Update._text_out`, its budget's closing tokens in `Sampling.sample`;
  `Update.token_hooks` see every token taken and `Sequence.force` writes tokens in the next row.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import llama_cpp

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.batching.media import text_only
from ggufdesk.engine.batching.prefix_cache import Slots
from ggufdesk.engine.batching.prompt_states import PromptStates
from ggufdesk.engine.batching.runner import Memory, ModelRunner, StepResult
from ggufdesk.engine.batching.sampling import Sampling, make_sampler
from ggufdesk.engine.batching.scheduler import Overloaded, Plan, Scheduler
from ggufdesk.engine.batching.sequence import Sequence, SequenceStatus
from ggufdesk.engine.batching.shift import room_needed, shift
from ggufdesk.engine.batching.text import TextStream
from ggufdesk.engine.batching.cpu_load import CpuLoad
from ggufdesk.engine.batching.threads import Threads
from ggufdesk.engine.batching.update import Update
from ggufdesk.engine.batching.vocab import Vocab
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.native import LoadedModel
from ggufdesk.engine.speculation.planner import DraftPlanner
from ggufdesk.engine.speculation.step_cost import StepCosts

log = logging.getLogger("ggufdesk.engine")

STATUS_EVERY_S = 0.25


class BatchEngine:
    """Runs every admitted request of one loaded model, step by step.

    emit: sends an event. cancelled(rid): whether rid was cancelled. set_batch(rids): tells the
    cancel book which requests the next decode call serves (a cancel of one of them aborts it).
    on_plain_done(stats): a request that ran alone without speculation ended (its final Stats).
    flush(): sends the events emitted so far in this step (called before each decode call, so what the
    step decided before computing, such as a cancel's Done, does not wait for the computation).
    clock: the time request deadlines are read on. decode, timer: llama.cpp's decode call and the
    timer of steps and drafting, whose costs speculation decides on (tests pass modelled ones).
    saved: prompt states kept beyond the slots (engine/batching/prompt_states.py), None when off.
    cpu: the CPU-load sensor (engine/batching/cpu_load.py), started before the model loaded so it has
    read the machine by the first step; None: one started now.
    """

    def __init__(self, lm: LoadedModel, vocab: Vocab, *, emit: Callable[[Any], None],
                 cancelled: Callable[[str], bool], set_batch: Callable[[list[str]], None],
                 on_plain_done: Callable[[P.Stats], None] | None = None,
                 flush: Callable[[], None] | None = None, verify_costs: dict[int, float] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 decode: Callable[[Any, Any], int] = llama_cpp.llama_decode,
                 timer: Callable[[], float] = time.perf_counter,
                 set_threads: Callable[[Any, int, int], None] = llama_cpp.llama_set_n_threads,
                 saved: PromptStates | None = None, cpu: CpuLoad | None = None) -> None:
        s = lm.settings
        self.clock = clock  # for request deadlines
        self._reaped_at: float | None = None  # the clock at the last _reap (prompt reading is not counted)
        self.lm, self.vocab, self.emit, self.cancelled = lm, vocab, emit, cancelled
        self.n_ctx = lm.n_ctx  # each sequence may grow to the whole context (unified KV cache)
        self.n_parallel = s.n_parallel
        self.mem = Memory(lm)
        self.slots = Slots(s.n_parallel, lm.n_ctx, self.mem, n_swa=int(llama_cpp.llama_model_n_swa(lm.model.model)))
        self.saved, self.flush = saved, flush
        self.sched: Scheduler[Sequence] = Scheduler(n_slots=s.n_parallel, n_cells=lm.n_ctx, n_batch=s.n_batch,
                                                    prefill_chunk=s.prefill_chunk)
        self.runner = ModelRunner(lm, self.slots, Sampling(lm, vocab), set_batch=set_batch, flush=flush,
                                  decode=decode, clock=timer)
        self.drafts = DraftPlanner(StepCosts(verify_costs), n_outputs=lm.n_outputs, n_batch=s.n_batch,
                                   n_ctx=lm.n_ctx, set_batch=set_batch, clock=timer)
        self.update = Update(lm, vocab, self.sched, self.slots, emit=emit, cancelled=cancelled,
                             on_plain_done=on_plain_done, on_finished=None if saved is None else saved.finished)
        # fewer threads while another program takes a core (engine/batching/threads.py); --threads: fixed
        fixed = bool(s.n_threads or s.n_threads_batch)
        self.threads = Threads(s.threads, s.threads_batch, fixed=fixed,
                               apply=lambda n, nb: set_threads(lm.ctx.ctx, n, nb),
                               load=cpu or CpuLoad.of_this_machine())
        self.update.threads = lambda: self.threads.decode.n
        self._status_sent: tuple[int, int, int, str, int] | None = None
        self._status_t = 0.0

    def set_verify_costs(self, costs: dict[int, float] | None) -> None:
        """The verification table measured for this model (engine/speculation/verify_cost.py)."""
        self.drafts.costs.set_table(costs)

    # ---- requests -----------------------------------------------------------------------------

    def submit(self, seq: Sequence) -> None:
        """Queue a request (EngineRequestError 'context' if it can never fit, 'overloaded' if the queue is full)."""
        if len(seq.prompt) >= self.n_ctx:
            raise context_error(len(seq.prompt), self.n_ctx - 1)
        try:
            self.sched.submit(seq)
        except Overloaded as e:
            raise P.EngineRequestError("overloaded", str(e)) from None
        self._status(force=False)

    @property
    def busy(self) -> bool:
        return self.sched.busy

    def cancel_all(self) -> None:
        """End every request (unload, load, shutdown while busy)."""
        for seq in self._all():
            self.update.finish(seq, SequenceStatus.FINISHED_CANCELLED)
        self._status(force=True)
        self._save_pending()

    def fail_all(self, message: str, detail: str = "") -> None:
        """A bug in a step: end every request with an error and start from an empty cache."""
        for seq in self._all():
            seq.status = SequenceStatus.FAILED
            self.update.release(seq)
            self.emit(P.Error(kind="bug", id=seq.rid, message=message, detail=detail))
        self.mem.clear()
        self.slots.reset()
        if self.saved is not None:
            self.saved.pending.clear()  # (their KV is gone)
        self._status(force=True)

    def idle(self) -> None:
        """Nothing left to run: send the final Status now (the throttle may have held it back)."""
        self._status(force=True)

    def _all(self) -> list[Sequence]:
        return list(self.sched.running) + list(self.sched.waiting)

    # ---- the step -----------------------------------------------------------------------------

    def step(self) -> None:
        """One engine step: schedule -> run -> update; then the prompt states it finished are saved."""
        plan = self.schedule()
        if plan.empty:
            self._status(force=True)
        else:
            self._run(plan)
        self._save_pending()

    def _run(self, plan: Plan[Sequence]) -> None:
        self.threads.prepare()  # a neighbour that took a core since the last step: fewer threads now
        n_running = len(self.sched.running)
        try:
            result = self.runner.run(plan)
        except KnownError as e:
            for seq in plan.sequences():
                self.update.fail(seq, e)
        else:
            if result is not None:  # (None: a cancel aborted the decode; the next step reaps it)
                self._settle(plan, result)
                self._prefilled(result)
                self.update.apply(result)
        self._status(force=len(self.sched.running) < n_running)  # a request ended: its counts go with its Done

    def _save_pending(self) -> None:
        """The prompt states this step queued, saved once its tokens and Done went out (prompt_states.py)."""
        if self.saved is not None and self.saved.pending:
            if self.flush is not None:
                self.flush()
            self.saved.save_pending()

    def schedule(self) -> Plan[Sequence]:
        """Reap what ended between steps, admit what fits, and plan the step's rows."""
        self._reap()
        for seq in self.sched.admit():
            self._admit(seq)
        plan = self.sched.plan()
        self._images(plan)
        if len(self.sched.running) > 1:
            for s in self.sched.running:
                s.alone = False
        forcing = [r for r in plan.decode if r.seq.forced]
        if forcing:  # (Sequence.force) written before anything is drafted, within the batch
            room = self.sched.n_batch - plan.decode_rows - plan.chunk
            for r in forcing:
                r.forced, r.seq.forced = r.seq.forced[:max(room, 0)], r.seq.forced[max(room, 0):]
                room -= len(r.forced)
        self.drafts.plan(plan)
        self._make_room(plan)
        return plan

    @staticmethod
    def _images(plan: Plan[Sequence]) -> None:
        """A prompt with images: an image where its prefill stands is the step's only prefill item,
        whole; a text chunk stops at the next image; no later prompt is read beside either."""
        for i, part in enumerate(plan.prefills):
            media = part.seq.media
            if media is None:
                continue
            del plan.prefills[i + 1:]
            image = media.span_at(part.seq.n_done)
            if image is None:
                part.n = media.text_room(part.seq.n_done, part.n)
            elif i == 0:
                plan.image, part.n = image, 0
            else:
                del plan.prefills[i]  # its image waits for a step of its own
            return

    def _reap(self) -> None:
        """Requests that end between steps: cancelled, or past their deadline. The time a request spends
        reading its prompt moves its deadline on: that is bounded by the context size the server chose
        (a 20k-token agent prompt takes minutes on a small CPU), while the deadline is for waiting and for
        runaway generations."""
        now, since = self.clock(), self._reaped_at
        self._reaped_at = now
        for seq in [*self.sched.running, *self.sched.waiting]:
            if self.cancelled(seq.rid):
                self.update.finish(seq, SequenceStatus.FINISHED_CANCELLED)
            elif seq.deadline is None:
                continue
            elif seq.status is SequenceStatus.PREFILLING:
                seq.deadline += 0.0 if since is None else max(0.0, now - since)
            elif now >= seq.deadline:
                self.update.expire(seq)

    def _admit(self, seq: Sequence) -> None:
        """Admitted: take a slot holding the longest cached prefix, make the sampler."""
        assert seq.status is SequenceStatus.PREFILLING
        seq.slot, seq.stats.n_reused = self.slots.acquire(seq.prompt, reuse=seq.reuse)
        if seq.media is not None:  # an image is decoded whole or not at all
            seq.stats.n_reused = seq.media.align(seq.stats.n_reused)
            self.slots.truncate(seq.slot, seq.stats.n_reused)
        elif self.saved is not None and seq.reuse:  # a longer prefix kept in RAM or on disk (by any process)
            n, tier = self.saved.restore(self.slots, seq.slot, seq.prompt)
            seq.ctx.restored = n if tier == "disk" else 0
            seq.stats.n_reused = len(seq.slot.tokens)
        seq.n_done = seq.stats.n_reused
        self._take_cells()
        base = seq.stats.n_reused  # llama-server's first progress report: read so far = what the cache held
        self.emit(P.Progress(id=seq.rid, phase="prefill", done=0, total=len(seq.prompt) - base,
                             n_prompt=len(seq.prompt)))
        if len(self.sched.running) == 1:
            llama_cpp.llama_perf_context_reset(self.lm.ctx.ctx)
        seq.sampler = make_sampler(self.lm, seq.sampling)
        seq.stream = TextStream(seq.sampling.stop, trim=seq.chat)
        s = seq.sampling
        if seq.sampler is not None and s.repeat_penalty != 1.0 and s.repeat_last_n:
            for t in text_only(seq.prompt)[-max(s.repeat_last_n, 0):]:
                seq.sampler.accept(t)

    def _take_cells(self) -> None:
        """The cells the prompts being read will fill, freed now rather than one chunk at a time. llama.cpp
        attends, in every step, over all cells up to the highest one in use, masked or not: idle slots evicted
        step by step leave a prompt's first chunks in cells above theirs and then every chunk spans both (the
        starter read 6,000 tokens at 0.74-0.83x its speed beside an idle 24,000-token slot, and an agent's
        next 24,900-token prompt at 0.77-0.81x llama-server's, docs/bench/server.md). Freed at once, its
        cells start near the bottom. Idle slots are still kept where there is room: nothing is evicted
        that the prompts would not evict anyway."""
        self.slots.evict(sum(s.prompt_left for s in self.sched.running
                             if s.status is SequenceStatus.PREFILLING and s.slot is not None))

    def _settle(self, plan: Plan[Sequence], result: StepResult) -> None:
        """What the step cost: the chunk sizer, the draft planner and the thread tuner learn from it."""
        sizer = self.sched.sizer
        if sizer is not None and (plan.decode or result.n_prompt):
            sizer.observe(result.rows - result.n_prompt, result.n_prompt, result.seconds, result.prompt_pos)
        self.drafts.settle(plan, result)
        self.threads.observe(result.rows, result.n_prompt, result.seconds, self.slots.used)

    # ---- the context --------------------------------------------------------------------------

    def _make_room(self, plan: Plan[Sequence]) -> None:
        """A `shift` request whose rows would pass the context's edge drops its oldest tokens after
        the system prompt (engine/batching/shift.py) and says so; the others never get that far."""
        for r in plan.decode:
            s = r.seq
            assert s.slot is not None
            if s.ctx.shifting and room_needed(s.slot, 1 + len(r.forced) + len(r.draft), self.n_ctx) \
                    and shift(self.slots, s.slot, s.ctx, self.n_ctx):
                self.emit(self.overflow_event(s))

    def _prefilled(self, result: StepResult) -> None:
        """Prompts that finished prefilling this step: a sliding-window model saves them now."""
        if self.saved is None:
            return
        for out in result.outputs:
            s = out.seq
            if out.prompt_done and s.slot is not None and s.n_done == len(s.prompt):
                self.saved.prefilled(s.slot)

    def overflow_event(self, s: Sequence) -> P.Overflow:
        """What the overflow policy dropped from s so far."""
        c = s.ctx
        return P.Overflow(id=s.rid, policy=c.applied or c.policy, truncated_tokens=c.truncated,
                          dropped_messages=c.dropped_messages, n_ctx=self.n_ctx, note=c.note)

    # ---- status -------------------------------------------------------------------------------

    def spec_mode(self) -> str:
        """Speculation now: 'off' (no drafter runs), the drafters' kind ('lookup', 'draft') while one of
        them may draft, 'paused' while all of them are paused or disabled."""
        mode = "off"  # (asked every step: the first drafter that may draft answers)
        for s in self.sched.running:
            d = s.drafter
            if d is not None:
                if not d.status.startswith("disabled"):
                    return d.control.label
                mode = "paused"
        return mode

    def _status(self, *, force: bool) -> None:
        """Status when it changed: at most every STATUS_EVERY_S while busy, at once when idle."""
        now = time.monotonic()
        state = (len(self.sched.running), len(self.sched.waiting), self.slots.used, self.spec_mode(),
                 self.runner.n_decode)
        if state == self._status_sent:
            return
        if not force and now - self._status_t < STATUS_EVERY_S and self._status_sent is not None:
            return
        self._status_sent, self._status_t = state, now
        running, queued, used, spec, n_decode = state
        self.emit(P.Status(running=running, queued=queued, kv_cells_used=used, kv_cells_total=self.n_ctx,
                           n_parallel=self.n_parallel, spec=spec, n_decode=n_decode, n_busy=self.runner.n_busy))


def context_error(n: int, room: int) -> P.EngineRequestError:
    return P.EngineRequestError("context", f"the prompt is {n} tokens but the context has room for {room}; "
                                "shorten it or load the model with a larger context")
