"""What a decode step costs by its number of rows: measured on every step, shaped by the verification table.

A step's cost is mostly one pass over the weights plus, per row with logits, the output layer (for
Gemma 3 its 262k-word vocabulary) and attention; whose sequence a row belongs to matters little.
So one curve serves a sequence alone verifying k drafts (1 + k rows) and N sequences decoding
side by side (N rows), or both (N + the drafts): its shape comes from engine/speculation/verify_cost.py's
table (every row count up to the rows reserved for drafts, measured at load), its level from the
steps the engine actually runs (every step without a prompt chunk is timed and kept per row count).
A row count not yet seen is predicted from the nearest recently seen one, scaled by the table's
shape between the two. The curve need not rise with every row: on the 2-core CPU an odd count of
rows with logits costs more than the even count above it (verify_cost.py), so beyond the table
the shape repeats its last PERIOD rows, each period dearer by what the table's last one added.
"""
from __future__ import annotations

import math

EMA = 0.2  # steps of one row count are steady: average over about five
FRESH = 64  # steps: an older measurement gives way to a fresher one as the anchor of a prediction
# Without a table (before it is measured, or a failed measurement): verifying costs a fixed 1.5
# plain steps plus a quarter per row, the CPU-ish prior engine/speculation/adaptive.py's line starts from.
PRIOR_FIXED, PRIOR_ROW = 1.5, 0.25
# Beyond a table of every row count its pattern repeats with this period: llama.cpp's CPU kernels
# work on 2 or 4 rows at a time (a period of 4 repeats a pattern of 2 as well).
PERIOD = 4


class StepCosts:
    """Seconds of a decode step of `rows` rows (all with logits), measured and predicted."""

    def __init__(self, table: dict[int, float] | None = None) -> None:
        self.seconds: dict[int, float] = {}  # rows -> measured seconds (EMA)
        self.seen: dict[int, int] = {}  # rows -> the step it was last measured at
        self.steps = 0
        # A step prices ~20 row counts: predictions are kept until the next observe, and each count's
        # anchor (and the table's factor from it) until the fresh counts or their order change.
        self._memo: dict[int, float] = {}
        self._anchors: dict[int, tuple[int, float]] = {}  # rows -> (anchor, shape(rows) / shape(anchor))
        self._fresh: list[tuple[int, int]] = []  # (rows, -last seen) of the fresh counts
        self._stale_at = 0  # the step at which the oldest of them goes stale
        self._last = 0  # the row count observed last
        self.set_table(table)

    def set_table(self, table: dict[int, float] | None) -> None:
        """k -> cost of verifying k drafts alone (k + 1 rows), in one-row steps."""
        pts = sorted((k + 1, c) for k, c in (table or {}).items() if k >= 1 and c > 0)
        self._points = [(1, 1.0)] + pts if pts else []
        self._at = dict(self._points)  # rows -> measured shape (every count, for a table of them all)
        self._memo.clear()
        self._anchors.clear()

    def lengths(self, k_max: int) -> list[int]:
        """The draft lengths to offer: those the table measured (k = rows - 1), else every k."""
        ks = [r - 1 for r, _ in self._points if r > 1]
        return [k for k in ks if k <= k_max] if ks else list(range(1, k_max + 1))

    def shape(self, rows: int) -> float:
        """A step of `rows` rows in one-row steps, by the table (or the prior without one)."""
        if rows <= 1:
            return 1.0
        pts = self._points
        if not pts:
            return PRIOR_FIXED + PRIOR_ROW * (rows - 1)
        if rows in self._at:
            return self._at[rows]
        for (r0, c0), (r1, c1) in zip(pts, pts[1:]):
            if rows <= r1:
                return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
        if len(pts) == 1:
            return 1.0 + PRIOR_ROW * (rows - 1)
        top = pts[-1][0]
        if len(pts) == top and top > PERIOD:  # every row count measured: repeat the last period
            periods = -(-(rows - top) // PERIOD)
            c = self._at
            return c[rows - periods * PERIOD] + periods * (c[top] - c[top - PERIOD])
        (r0, c0), (r1, c1) = pts[-2], pts[-1]  # beyond a sparse table: its last slope
        return c1 + (c1 - c0) / (r1 - r0) * (rows - r1)

    def observe(self, rows: int, seconds: float) -> None:
        """A step of `rows` rows without a prompt chunk took `seconds`."""
        self.steps += 1
        self._memo.clear()
        if rows >= 1 and seconds > 0:
            old = self.seconds.get(rows)
            # anchors hold while the same fresh count is measured again (the latest stays the latest)
            if old is None or rows != self._last or self.steps - 1 - self.seen[rows] > FRESH:
                self._forget_anchors()
            self.seconds[rows] = seconds if old is None else old + EMA * (seconds - old)
            self.seen[rows] = self.steps
            self._last = rows
        if self._fresh and self.steps >= self._stale_at:
            self._forget_anchors()

    def _forget_anchors(self) -> None:
        self._anchors.clear()
        self._fresh = []

    def predict(self, rows: int) -> float | None:
        """Seconds of a step of `rows` rows (None before any step was measured)."""
        rows = max(rows, 1)
        t = self._memo.get(rows)
        if t is not None:
            return t
        if rows in self.seconds and self.steps - self.seen[rows] <= FRESH:
            t = self.seconds[rows]
        elif not self.seconds:
            return None
        else:
            anchor, factor = self._anchors.get(rows) or self._anchor(rows)
            t = self.seconds[anchor] * factor
        self._memo[rows] = t
        return t

    def _anchor(self, rows: int) -> tuple[int, float]:
        """The measured count a prediction for `rows` scales from: the nearest fresh one in ratio, the
        latest measured at a tie (every measured one when none is fresh)."""
        if not self._fresh:
            fresh = [r for r in self.seconds if self.steps - self.seen[r] <= FRESH] or list(self.seconds)
            self._fresh = [(r, -self.seen[r]) for r in fresh]
            self._stale_at = min(self.seen[r] for r in fresh) + FRESH + 1
        _, _, anchor = min((abs(math.log(r / rows)), age, r) for r, age in self._fresh)
        a = self._anchors[rows] = (anchor, self.shape(rows) / self.shape(anchor))
        return a
