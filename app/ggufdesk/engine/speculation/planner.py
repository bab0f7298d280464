"""Draft rows in a batched step: which running sequences speculate, how far, priced by whole-step costs.

Every running sequence with a drafter may add draft rows to its decode row, in the same
`llama_decode` as the others' rows, within the step's budget (the logits rows reserved at load and
n_batch). A draft pays when the tokens it is expected to add outweigh what its rows add to the step:
beside N decode rows, a sequence's own plain token costs its share of the step, T(N) / N, and k
draft rows add T(R + k) - T(R) (R: the rows already planned), both from engine/speculation/step_cost.py.
Alone (N = 1) that is the verification table itself; beside others a draft row costs about half a
decode row's share (bench/batch.py part 1 measured 0.54-0.59x on the 2-core CPU), so a short draft is
cheaper there than alone (where the first row turns a one-row step into a two-row one, +0.8), and
the controller sees the difference. The prices follow the step's whole count of rows with logits,
which is not smooth: on that CPU an odd count costs more than the even count above it
(engine/speculation/verify_cost.py), so beside four decode rows a draft of 2 or 4 is cheap and one
of 1 or 3 dear, and beside three rows one draft row makes the step cheaper than none. Every length
the table measured is offered, and the drafters, choosing in turn, land the step on cheap counts.

Each drafter's controller (engine/speculation/adaptive.py) gets those prices as its cost table in
units of its plain share (`DraftLength.price`) and decides its length, or to draft nothing; after
the step it is told what the step cost it in the same units: the measured step over the predicted
one, times its share plus what its rows added, plus its drafting time, plus what the draft costs the
steps after it: the first draft that changes a step's shape from the run of steps before it is charged
what the next steps pay for the change (engine/speculation/shape_cost.py: 0.03-0.12 plain steps on
the 2-core CPU; on a GPU whose one-row steps replay a CUDA graph, by llama.cpp's source, the graph-less
steps it causes, not yet measured on one). Where the steps before ran more rows than this one needs
(a draft beside the decode rows) and holding that count costs less than leaving it (`ShapeCosts.hold`,
from measured steps: on a GPU a replayed graph of eight rows may cost what one of four does and a
change several plain steps; on the 2-core CPU every row costs and a change almost nothing), the step
is padded to it, as vLLM pads a batch to a captured graph's size: drafts inside it cost nothing, and
rows no drafter fills carry filler (the row's last token again), verified like drafts (one that
matches is a token like any) and neither billed nor counted as any drafter's. The controllers keep
their own ways back from a pause (engine/speculation/adaptive.py, evidence.py): no price makes them
stop for good. A drafter whose controller will not look for a while whatever the steps say (resting
between looks, paused, disabled: `DraftLength.idle`) is skipped until then and told afterwards how
many tokens were written: beside three others on a GPU, drafters that only kept count cost a
one-millisecond step some percent (bench/bookkeeping.py). Sequences take turns at the front of the
queue for rows, so a long drafter cannot starve the others.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ggufdesk.engine.batching.runner import StepResult
from ggufdesk.engine.batching.scheduler import DecodeRow, Plan
from ggufdesk.engine.batching.sequence import Sequence, SequenceStatus
from ggufdesk.engine.speculation.shape_cost import EMA, ShapeCosts
from ggufdesk.engine.speculation.step_cost import StepCosts


@dataclass
class _Bill:
    share: float  # predicted seconds of the sequence's plain share of the step
    extra: float  # predicted seconds its draft rows add
    after: float  # predicted seconds its draft adds to the steps after it (a change of the step's shape)
    drafting: float  # seconds its drafter spent looking: pricing and proposing (setup excluded)


class DraftPlanner:
    """Adds draft rows to plans and settles what they cost."""

    def __init__(self, costs: StepCosts, *, n_outputs: int, n_batch: int, n_ctx: int,
                 set_batch: Callable[[list[str]], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.costs = costs
        self.shapes = ShapeCosts()
        self.n_outputs, self.n_batch, self.n_ctx = n_outputs, n_batch, n_ctx
        self.set_batch, self.clock = set_batch, clock
        self._turn = 0
        self._since = 0  # steps since a drafter drafted
        self._gap: float | None = None  # steps between two steps with drafts (EMA), None before two
        self._drafted = False
        self._held = 0  # the rows this step was padded to (0: none)
        self._drafting = False  # did a drafter draft this step?
        self._bills: dict[int, _Bill] = {}  # id(decode row) -> its bill, for this step
        self._drafters = False  # has this step a drafter in it (asleep or not)?

    def plan(self, plan: Plan[Sequence]) -> None:
        """Give the plan's decode rows their drafts (and mark them VERIFYING)."""
        self._bills.clear()
        self._held, self._drafting = 0, False
        rows = [r for r in plan.decode if r.seq.drafter is not None]
        self._drafters = bool(rows)
        if not rows:
            return
        turn = self._turn % len(rows)
        self._turn += 1
        order = rows[turn:] + rows[:turn]
        # a drafter dozing this step is a plain row with nothing to bill: in many steps of free text every
        # drafter dozes, and then nothing is priced (beside three others a GPU step's few percent)
        awake = [r for r in order if not self._dozes(r.seq)]
        n = len(plan.decode)
        if not awake and self.shapes.rows <= n:
            return  # nothing to draft and no larger shape to hold
        decode_rows = plan.decode_rows
        part = plan.chunk
        completes = sum(p.completes for p in plan.prefills)  # a prompt's last row wants logits too
        budget = min(self.n_outputs - n - completes, self.n_batch - decode_rows - part)
        total = decode_rows + completes  # rows with logits: the prompts' other rows add the same to every k
        hold = self._held = self._hold(order, total, budget) if part == 0 else 0
        if awake:
            plain = self.costs.predict(n)
            used = self._draft_all(awake, budget, total, plain / n if plain else None, part, hold)
            budget, total, self._drafting = budget - used, total + used, used > 0
        if hold > total:
            self._pad(order, hold - total, budget)

    def _hold(self, order: list[DecodeRow[Sequence]], total: int, budget: int) -> int:
        """The row count to pad this step to, to keep the last steps' shape (0: none)."""
        top = self.shapes.rows
        if top <= total or top - total > budget or self._gap is None:
            return 0
        if sum(self._room(r, budget) for r in order) < top - total:
            return 0  # the rows cannot be padded that far
        return top if self.shapes.hold(total, max(self._gap, self._since), self.costs.shape) else 0

    def _pad(self, order: list[DecodeRow[Sequence]], n: int, budget: int) -> None:
        """n filler rows after the drafts of the rows in `order` with room: verified like drafts (one
        that matches is a token like any), not the drafters' (neither billed nor counted as theirs)."""
        if n > budget:
            return
        fits = []
        for r in order:
            room = min(self._room(r, budget + len(r.draft)) - len(r.draft), budget)
            if room > 0:
                fits.append((r, min(room, n)))
                n -= fits[-1][1]
                if n == 0:
                    break
        if n:
            return  # not enough room: the step changes shape anyway
        for r, k in fits:
            last = r.draft[-1] if r.draft else r.seq.last
            r.draft.extend([last] * k)
            r.pad = k
            r.seq.status = SequenceStatus.VERIFYING

    def _draft_all(self, rows: list[DecodeRow[Sequence]], budget: int, total: int, share: float | None,
                   part: int, hold: int) -> int:
        """Each drafter awake in turn: a plain row while it does not look, else drafted. The rows drafted."""
        # the first draft to change the step's shape pays what the change costs the steps after it (a
        # prompt chunk changes the shape anyway); priced only when a drafter looks. Rows up to `hold`
        # (padded to anyway) cost nothing and change nothing.
        steady, change, used = max(total, hold), None, 0
        for r in rows:
            d = r.seq.drafter
            assert d is not None
            if not share or d.k <= 0:
                self._rest(r, share)
                continue
            if change is None:
                change = self.shapes.penalty(steady) if part == 0 else 0.0
            k = self._draft(r, budget, total, share, change if total <= steady else 0.0, hold)
            budget -= k
            total += k
            used += k
        return used

    @staticmethod
    def _dozes(s: Sequence) -> bool:
        """Is s's drafter skipped this step (its control idle for tokens not yet all written)? When
        they are, it wakes, told how many were written."""
        d = s.drafter
        assert d is not None
        c = d.control
        if not c.dozing:
            return False
        written = s.stats.n_gen
        if c.dozed_at < 0:
            c.dozed_at = written
        if written - c.dozed_at < c.dozing:
            c.asleep = written - c.dozed_at + 1  # with this step's token: a pause's countdown in the status goes on
            return True
        d.woke(written - c.dozed_at)
        c.dozing, c.dozed_at = 0, -1
        return False

    def _rest(self, r: DecodeRow[Sequence], share: float | None) -> None:
        """r's drafter does not look this step (k 0, or no plain step measured yet): a plain row."""
        r.draft = []
        r.seq.status = SequenceStatus.DECODING
        self._bills[id(r)] = _Bill(share or 1.0, 0.0, 0.0, 0.0)

    def _draft(self, r: DecodeRow[Sequence], budget: int, total: int, share: float, after: float,
               hold: int) -> int:
        """Price r's draft rows beside the `total` rows planned so far (and `after`, what any draft costs
        the steps after this one), let its drafter choose, propose (its drafter's k is above 0)."""
        s, d = r.seq, r.seq.drafter
        assert d is not None
        room = self._room(r, budget)
        base = self.costs.predict(max(total, hold))
        draft: list[int] = []
        spent = 0.0
        extra = 0.0
        if base is not None and room >= 1:
            t = self.clock()
            # k drafts cost what they add to the step and after it, in units of the sequence's share of the step
            ks = [k for k in self.costs.lengths(d.control.k_max) if k <= room] or [1]
            d.control.price({k: 1.0 + (self._predict(max(total + k, hold)) - base + after * (total + k > hold)) / share
                             for k in ks}, share)
            k = min(d.k, room)
            setup = 0.0
            if k > 0:
                draft = self._propose(s, k)
                extra = self._predict(max(total + len(draft), hold)) - base
                setup = d.setup_s
            spent = max(self.clock() - t - setup, 0.0)  # the look: pricing and proposing
        r.draft = draft
        s.status = SequenceStatus.VERIFYING if draft else SequenceStatus.DECODING
        self._bills[id(r)] = _Bill(share, extra, after * (bool(draft) and total + len(draft) > hold), spent)
        return len(draft)

    def _room(self, r: DecodeRow[Sequence], budget: int) -> int:
        """Draft rows r may have: within the step's budget, max_tokens and the context."""
        s = r.seq
        if r.forced or s.slot is None:
            return 0
        room = min(budget, s.max_gen - s.stats.n_gen - 1, self.n_ctx - len(s.slot.tokens) - 2)
        thinking = None if s.reasoning is None else s.reasoning.room()  # a reasoning budget: not past it
        return room if thinking is None else min(room, thinking)

    def _propose(self, s: Sequence, k: int) -> list[int]:
        """s's drafter's proposal of at most k tokens."""
        d = s.drafter
        assert d is not None and s.slot is not None
        if self.set_batch is not None:
            self.set_batch([s.rid])  # a cancel of this request stops a draft model's catching up
        try:
            draft = d.propose(s.slot.tokens, s.last, k)[:k]
            if s.constraint is not None:  # under a grammar: not past the first token it refuses
                del draft[s.constraint.fitting(draft):]
            return draft
        finally:
            if self.set_batch is not None:
                self.set_batch([])

    def _predict(self, rows: int) -> float:
        t = self.costs.predict(rows)
        assert t is not None
        return t

    def _count(self) -> None:
        """How often drafts change the step's shape anyway (what a hold saves for). Drafts inside a
        hold cost nothing and say nothing of it, so a hold that costs its steps something ends once
        it has cost what leaving the run would."""
        self._since += 1
        if self._drafting and not self._held:
            if self._drafted:
                self._gap = self._since if self._gap is None else self._gap + EMA * (self._since - self._gap)
            self._drafted, self._since = True, 0

    def settle(self, plan: Plan[Sequence], result: StepResult) -> None:
        """The step ran: learn its cost and tell each drafter what it got and what it paid. (Steps
        without a drafter in them are not learnt from: a drafter's first step is a plain one; every
        step's shape is, for what a change of shape costs.)"""
        self.shapes.step(result.rows, result.seconds if result.n_prompt == 0 else None)
        if not self._drafters:  # (drafters asleep still learn the step's cost)
            return
        self._count()
        scale = 1.0
        if result.n_prompt == 0:
            predicted = self.costs.predict(result.rows) if self._bills else None  # (a bill's scale)
            self.costs.observe(result.rows, result.seconds)
            if predicted:
                scale = result.seconds / predicted
        if not self._bills:  # every drafter dozed: nothing to tell them
            return
        outputs = {id(o.seq): o for o in result.outputs}
        for r in plan.decode:
            s, bill = r.seq, self._bills.get(id(r))
            if s.drafter is None or bill is None:
                continue
            out = outputs[id(s)]
            drafted = len(r.draft) - r.pad
            accepted = min(out.accepted, drafted)
            cost = (scale * (bill.share + bill.extra) + bill.after + bill.drafting) / bill.share
            s.drafter.feedback(drafted, accepted, cost, bill.drafting / bill.share)
            st = s.stats
            st.drafted += drafted
            st.drafts += 1 if drafted else 0
            st.accepted += accepted
            st.draft_len, st.speculation = s.drafter.k, s.drafter.status
            s.drafter.control.dozing = s.drafter.control.idle()  # skipped until then (0: asked next step)
