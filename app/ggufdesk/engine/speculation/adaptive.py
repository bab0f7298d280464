"""Adaptive draft length: pick K from measured acceptance and measured step costs, or switch off.

The loop reports every step: how many tokens were drafted, how many accepted, and what the step
cost (engine/speculation/planner.py: in units of the sequence's share of a plain step, its drafting time
included; a controller driven by hand may report seconds). Plain steps (nothing drafted) give the
plain cost t0. In the step loop the planner prices draft rows before every step (`price`): the
cost of k drafts beside the step's other rows, from measured whole steps. The cost of verifying k
drafted tokens comes from the engine's measurement of this machine (engine/speculation/verify_cost.py: a table
of k -> cost in plain steps, for every k up to the rows reserved), scaled by how recent speculative
steps compared with it; only measured lengths are drafted. Before that table exists, t(k) is fitted as a
line a + b*k over recent steps from an optimistic prior. With the acceptance rate
a over a sliding window, the expected tokens of a step with k drafted is (1 - a^(k+1)) / (1 - a);
K is the k that maximises expected tokens / t(k). Looking for a draft has its own price, paid
also when nothing is drafted (prompt lookup's search and the pricing of its lengths: 0.1-0.2 ms a
step, 2% of a plain step on a 2-core CPU but a tenth of one with a small model on a GPU); a drafter
that reports its looks (`looked`) rests between them while they lose more than they win, for a
stride that doubles up to what makes looking cost REST_SHARE of plain decoding, and looks every
step again as soon as one pays. When speculation is measured slower than
plain decoding and no k is predicted to beat it, it is paused, not ended: after a backoff in
tokens (doubling each time, up to PAUSE_MAX) it tries again with fresh evidence, so a request
whose first drafts fail but whose later text is copyable gets speculation back. A drafter that
weighs every draft by its own evidence (`sizes_drafts`) gets k = K max and chooses the length
itself; the others get the window's K. While k stays 0 whatever the steps report (resting, paused,
disabled: `idle`), the step loop skips the controller and tells it afterwards what it missed (`woke`):
beside three others, drafters that only kept count cost a GPU step some percent.
"""
from __future__ import annotations

import logging
import math
import statistics
from collections import deque

log = logging.getLogger("ggufdesk.engine.speculation.speculative")

WINDOW = 16  # speculative steps remembered for acceptance and measured rate
MIN_EVIDENCE = 5  # speculative steps before we may switch off
IDLE_FOREVER = 1 << 30  # tokens: a disabled controller is never asked again
REPROBE_EVERY = 64  # speculative steps between plain probes (the plain cost drifts: context grows)
WORTH_MARGIN = 1.1  # a draft must be predicted this much faster than a plain step
PAUSE_FIRST = 32  # tokens of plain decoding after speculation was measured slower, at first
PAUSE_MAX = 1024  # ... doubling on every new pause up to this
CORRECTION = (0.5, 2.0)  # how far measured steps may scale the cost table (context growth, a busy machine)
# Between looks that do not pay, a drafter rests for at most the stride that spreads a look's own cost
# to this share of plain decoding, and not at all where a look costs less than twice that. 2%: under
# what one category's runs vary by on this CPU (3-10%), so a rest is only taken where it saves more
# than the noise, and within the free-writing target (>= 0.97x plain). A look costs 1-2% of a step on
# the 2-core CPU, so lookup does not rest there (resting every second step there, at 1%, caught some
# of the starter's copies late: docs/bench/speculative-decoding.md, "On a GPU"); on an H200 with
# SmolLM2, about a tenth of a step, so it looks every fifth token there while looks do not pay.
REST_SHARE = 0.02


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens emitted by a step drafting k tokens, each accepted with probability alpha."""
    if alpha >= 0.999:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class DraftLength:
    """Chooses K for the next step; `k` is 0 for a plain probe step, while paused, or once disabled."""

    def __init__(self, *, k_min: int, k_max: int, adaptive: bool, label: str, k_start: int | None = None,
                 sizes_drafts: bool = False, costs: dict[int, float] | None = None) -> None:
        self.k_min, self.k_max, self.adaptive, self.label = k_min, k_max, adaptive, label
        self.sizes_drafts = sizes_drafts
        # measured cost of drafting k, in plain steps (engine/speculation/verify_cost.py); None: fit a line
        self.costs = self._usable(costs)
        self.unit_s: float | None = None  # seconds of a cost unit, when the loop prices the steps
        self._k = self.snap(min(k_max, max(k_min, k_start or k_max)))
        self.plain: deque[float] = deque(maxlen=8)  # recent plain step seconds
        self._t0: float | None = None  # their median, taken when read after a plain step (read many times a step)
        self._corr: float | None = None  # correction(), kept until the next step's evidence or prices
        self.samples: deque[tuple[int, float]] = deque(maxlen=32)  # recent (n drafted, step cost)
        self.predicted: deque[float] = deque(maxlen=32)  # ... and the table's ratio for it then
        self.window: deque[tuple[int, int, float]] = deque(maxlen=WINDOW)
        self.since_plain = 0
        self.disabled = ""  # for good (e.g. the draft's context is full)
        self.paused = ""  # for now: speculation was measured slower; tried again at resume_at
        self.resume_at = 0
        self.backoff = PAUSE_FIRST
        self.pauses = 0
        self.tokens = 0  # tokens emitted in this request (the clock of the backoff)
        self.spec_steps = 0
        self.stride = 1  # tokens from one look to the next: more than 1 while looking does not pay
        self.look_at = 0  # the token count at which the next look is due
        self.gains: deque[float] = deque(maxlen=WINDOW)  # what recent looks won, in plain steps (< 0: lost)
        self.looks: deque[float] = deque(maxlen=WINDOW)  # ... and what looking itself cost them
        self.dozing = 0  # tokens the step loop skips this controller for (engine/speculation/planner.py)
        self.dozed_at = -1  # ... counted from the sequence's tokens at its first skipped step (-1: not yet)
        self.asleep = 0  # tokens written while skipped, not yet told (`woke`): the status counts them

    # ---- what the loop reads ------------------------------------------------------------------

    @property
    def k(self) -> int:
        if self.disabled:
            return 0
        if not self.adaptive:
            return self.k_max
        if self.paused:
            if self.tokens < self.resume_at:
                return 0
            self._resume()
        if self.tokens < self.look_at:
            return 0  # resting between looks that did not pay
        if not self.plain or self.since_plain >= REPROBE_EVERY:
            return 0  # probe: one plain step to know what we are competing with
        return self.k_max if self.sizes_drafts else self._k

    @property
    def status(self) -> str:
        if self.disabled:
            return f"disabled: {self.disabled}"
        if self.paused and self.tokens < self.resume_at:
            left = max(self.resume_at - self.tokens - self.asleep, 0)
            return f"disabled: {self.paused}; retrying after {left} more tokens"
        return self.label

    def idle(self) -> int:
        """Tokens from now for which k stays 0 whatever the steps report (plain steps all): resting
        between looks, paused, or for good. The loop need not ask or tell the controller anything then."""
        if self.disabled:
            return IDLE_FOREVER
        if not self.adaptive:
            return 0
        if self.paused and self.tokens < self.resume_at:
            return self.resume_at - self.tokens
        return max(self.look_at - self.tokens, 0)

    def woke(self, tokens: int) -> None:
        """`tokens` were written in plain steps while the loop skipped the controller (`idle`): no probe
        is owed (those were plain steps), and the plain cost is the one measured before the skip."""
        self.tokens += tokens
        self.asleep = 0
        self.since_plain = 0
        self._corr = None

    def _usable(self, costs: dict[int, float] | None) -> dict[int, float] | None:
        return {k: c for k, c in sorted((costs or {}).items()) if self.k_min <= k <= self.k_max and c > 0} or None

    def price(self, costs: dict[int, float], unit_s: float | None = None) -> None:
        """The cost of drafting k in the coming step, in plain steps (its share of the step), from
        the step loop (engine/speculation/planner.py); unit_s: what a plain step is in seconds now."""
        self.costs = self._usable(costs) or self.costs
        self.unit_s = unit_s
        self._corr = None

    def disable(self, why: str) -> None:
        """Off for the rest of the request (something that will not change, like a full context)."""
        if not self.disabled:
            self.disabled = why
            log.info("speculation off for this request: %s", why)

    def pause(self, why: str) -> None:
        """Off for the next `backoff` tokens, then tried again on fresh evidence."""
        self.paused, self.resume_at = why, self.tokens + self.backoff
        self.pauses += 1
        log.info("speculation paused for %d tokens: %s", self.backoff, why)
        self.backoff = min(2 * self.backoff, PAUSE_MAX)

    def _resume(self) -> None:
        self.paused = ""
        self.stride, self.look_at = 1, 0
        self.window.clear()  # judge the text as it is now, not as it was
        self._k = self.snap(max(self.k_min, min(self.k_max, 4)))

    # ---- what the loop reports ----------------------------------------------------------------

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float, overhead: float = 0.0) -> None:
        """One step: n_drafted proposed, n_accepted kept, seconds of wall time (overhead = drafting
        time that produced nothing, e.g. a draft model below p_min at its first token)."""
        self.tokens += n_accepted + 1
        self._corr = None
        if n_drafted == 0:
            self.plain.append(max(seconds - overhead, 1e-6))
            self._t0 = None  # (a resting drafter's plain steps need no median: taken when read)
            self.since_plain = 0
            if overhead > 0:  # a step we paid drafting for: it counts against speculation
                self.window.append((0, 0, seconds))
            return
        self.since_plain += 1
        self.spec_steps += 1
        self.samples.append((n_drafted, seconds))
        self.predicted.append(self.ratio(n_drafted) if self.costs else 0.0)
        self.window.append((n_drafted, n_accepted, seconds))
        if self.adaptive and self.t0 is not None:
            self._adapt()

    def looked(self, n_drafted: int, n_accepted: int, cost: float, looking: float) -> None:
        """A step on which the drafter looked for a draft (after `feedback`): `looking` is what the
        look cost (its search and pricing, in plain steps), `cost` the whole step's. A look wins the
        tokens its draft added less what the step cost beyond a plain one, or loses its own cost when
        it drafted nothing. While the recent looks lost more than they won, the next look waits twice
        as long, up to the stride at which looking costs REST_SHARE of plain decoding; one that wins
        brings back a look every step."""
        if not self.adaptive or looking <= 0 or not self.plain:
            return  # (a modelled clock, a step it did not look on, or no plain step yet: nothing to weigh)
        t0 = self.t0
        assert t0 is not None
        gain = (n_accepted + 1) * t0 - cost if n_drafted else -looking
        self.gains.append(gain)
        self.looks.append(looking)
        if gain > 0 or sum(self.gains) >= 0:
            self.stride = 1
        elif len(self.gains) >= MIN_EVIDENCE:
            # rest until looking, spread over the tokens between looks, costs REST_SHARE of a plain
            # step; failed drafts keep the stride up but do not stretch it (the pause and the
            # evidence answer for them), so a copy that starts while resting is caught that late at most
            most = math.floor(statistics.median(self.looks) / (REST_SHARE * t0))
            self.stride = max(1, min(2 * self.stride, most))
        self.look_at = self.tokens + self.stride - 1

    # ---- the model ----------------------------------------------------------------------------

    def alpha(self) -> float:
        """Per-token acceptance over the window (geometric model, lightly smoothed)."""
        acc = sum(a for n, a, _ in self.window if n)
        fails = sum(1 for n, a, _ in self.window if n and a < n)
        return (acc + 0.5) / (acc + fails + 1.0)

    @property
    def t0(self) -> float | None:
        """The plain step's cost: median of recent plain steps (robust to a stray slow step)."""
        if self._t0 is None and self.plain:
            self._t0 = statistics.median(self.plain)
        return self._t0

    def line(self) -> tuple[float, float]:
        """(a, b) of step seconds = a + b * n_drafted, least squares over recent speculative steps.

        Prior before two distinct lengths are seen: b = t0 / 4 (optimistic enough to try; on this
        CPU a verification row costs ~t0/3 beyond a fixed ~1.5 t0, on a GPU far less).
        """
        t0 = self.t0
        assert t0 is not None
        pts = list(self.samples)
        ns = {n for n, _ in pts}
        if len(ns) >= 2:
            mn = statistics.fmean(n for n, _ in pts)
            ms = statistics.fmean(t for _, t in pts)
            b = sum((n - mn) * (t - ms) for n, t in pts) / sum((n - mn) ** 2 for n, _ in pts)
            b = max(b, 0.0)
            return max(ms - b * mn, t0), b
        b = t0 / 4
        if pts:
            return max(statistics.fmean(t - b * n for n, t in pts), t0), b
        return 1.5 * t0, b

    def lengths(self, top: int | None = None) -> list[int]:
        """The draft lengths to choose from, at most `top`: the measured ones, or every k."""
        hi = self.k_max if top is None else min(top, self.k_max)
        if self.costs:
            return [k for k in self.costs if k <= hi]
        return list(range(self.k_min, hi + 1))

    def snap(self, k: int) -> int:
        """The longest measured length not above k (the shortest if none is)."""
        if not self.costs:
            return k
        return max((j for j in self.costs if j <= k), default=min(self.costs))

    def ratio(self, k: int) -> float:
        """The cost table at k, in plain steps (interpolated between measured lengths)."""
        assert self.costs
        if k in self.costs:  # (every length offered is: ~16 are priced a look)
            return self.costs[k]
        ks = list(self.costs)
        lo = max((j for j in ks if j < k), default=None)
        hi = min((j for j in ks if j > k), default=None)
        if lo is None:
            lo, c_lo = 0, 1.0
        else:
            c_lo = self.costs[lo]
        if hi is None:  # beyond the table: the last measured slope
            hi = lo
            lo2 = max((j for j in ks if j < hi), default=0)
            slope = (self.costs[hi] - self.costs.get(lo2, 1.0)) / max(hi - lo2, 1)
            return self.costs[hi] + slope * (k - hi)
        return c_lo + (self.costs[hi] - c_lo) * (k - lo) / (hi - lo)

    def correction(self) -> float:
        """How recent speculative steps compared with the table's prediction (median, bounded)."""
        t0 = self.t0
        if not self.costs or t0 is None or len(self.samples) < 3:
            return 1.0
        if self._corr is None:  # the same for every length priced this step
            r = statistics.median(t / (t0 * (p or self.ratio(n))) for (n, t), p in zip(self.samples, self.predicted))
            self._corr = min(max(r, CORRECTION[0]), CORRECTION[1])
        return self._corr

    def step_cost(self, k: int) -> float:
        """Predicted seconds of a step drafting k tokens."""
        if self.costs:
            assert self.t0 is not None
            return self.t0 * self.ratio(k) * self.correction()
        a, b = self.line()
        return a + b * k

    def best(self, alpha: float | None = None) -> tuple[int, float]:
        """(k, predicted tokens/s) of the best draft length, for the window's acceptance or `alpha`."""
        rates = self.rates(self.alpha() if alpha is None else alpha, self.lengths())
        k = max(rates, key=rates.__getitem__)
        return k, rates[k]

    def rates(self, alpha: float, ks: list[int]) -> dict[int, float]:
        """Predicted tokens/s of drafting each k in ks (lengths()) at acceptance alpha."""
        if not self.costs:
            return {k: expected_tokens(alpha, k) / self.step_cost(k) for k in ks}
        # step_cost(k), its length-free factors taken once, and expected_tokens written out: ~16 lengths
        # are priced at every look that finds a draft (the same arithmetic, in the same order)
        assert self.t0 is not None
        unit, costs = self.t0 * self.correction(), self.costs
        if alpha >= 0.999:
            return {k: (k + 1.0) / (unit * (costs.get(k) or self.ratio(k))) for k in ks}
        q = 1.0 - alpha
        return {k: (1.0 - alpha ** (k + 1)) / q / (unit * (costs.get(k) or self.ratio(k))) for k in ks}

    def worth(self, alpha: float, k: int) -> int:
        """The draft length (at most k) worth proposing at acceptance alpha (0 = a plain step is faster)."""
        if not self.adaptive or self.t0 is None:
            return k
        ks = self.lengths(max(self.k_min, k))
        if not ks:
            return 0
        rates = self.rates(alpha, ks)
        kb = max(rates, key=rates.__getitem__)
        return min(k, kb) if rates[kb] > WORTH_MARGIN / self.t0 else 0

    def marginal(self) -> float:
        """The chance of acceptance below which one more drafted token costs more time than it saves
        (what its verification row adds to the step, against a plain step t0 a token is worth)."""
        if self.t0 is None:
            return 0.0
        k = self._k
        return min(0.9, max(0.0, (self.step_cost(k + 1) - self.step_cost(k)) / self.t0))

    def measured_rate(self) -> float:
        """Tokens per second of recent steps: the median step's, so that one step stalled by
        another process on a busy machine cannot switch speculation off for the whole request."""
        rates = [(a + 1) / s for _, a, s in self.window if s > 0]
        return statistics.median(rates) if rates else 0.0

    def _adapt(self) -> None:
        assert self.t0 is not None  # observe() adapts only once t0 is known
        k_best, predicted = self.best()
        plain = 1.0 / self.t0
        if self.costs:  # measured lengths only: go straight to the best of them
            self._k = k_best
        else:  # move towards the best k, at most doubling or halving per step
            self._k = max(self.k_min, min(self.k_max, k_best, 2 * self._k), self._k // 2, 1)
            self._k = min(self._k, self.k_max)
        n, a, _ = self.window[-1]
        if len(self.window) >= MIN_EVIDENCE and a < n:  # never right after a draft that was all accepted
            measured = self.measured_rate()
            if measured < plain and predicted < plain:
                self.pause(f"slower than plain ({measured / plain:.2f}x its rate, acceptance {self.alpha():.0%})")
