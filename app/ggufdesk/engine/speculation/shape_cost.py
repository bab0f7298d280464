"""What changing a step's shape costs the steps after it: measured, and charged to the draft that changes it.

A decode step's cost can depend on the steps before it, not only on its own rows. llama.cpp's CUDA
backend (`ggml_backend_cuda_graph_compute` in vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu of
the llama-cpp-python we build) replays a captured CUDA graph only for a graph like the two before it:
a step whose shape differs from the step before runs its kernels one by one, the next step of that
shape captures the graph, and only the third replays it. A draft turns a run of one-row steps into
1 -> 1+k -> 1 -> 1 -> 1: the draft step and the two one-row steps after it all run without the graph.
On a lent H200 with SmolLM2 (a plain step about 1.2 ms, most of it launching kernels), failed drafts
cost several plain steps more than the load-time verification table says (docs/bench/
speculative-decoding.md, "On a GPU"): that table times each shape once per round, never replayed,
and the planner billed a draft only its own step.

So the planner measures it instead of knowing the backend (`ShapeCosts.step`): for each row count,
what its steps cost 1 and 2 steps into a run of that count over what the same count costs steadily
(measured at most FRESH steps before: a context that grows makes every step dearer), and a draft
that breaks a run is charged what the steps after it will pay over the run's going on (`penalty`).
A run that starts after a prompt chunk is not measured: what that chunk costs the next steps is not
a draft's doing. Where the steps after a change cost about what the others do the charge is small
(the 2-core CPU: the first one-row step after a draft 3-8% dearer, 0.03-0.12 plain steps in all,
bench/shape_cost.py), and on a modelled clock, where they cost exactly the same, it is nothing.

The same measurements say when not to change the shape at all (`hold`): after a draft, a step that
needs fewer rows than the run before it can be padded to the run's count (engine/speculation/
planner.py). Held, each step pays what that count costs steadily over its own until a draft would
change the shape anyway (`gap` steps, measured by the planner); left, the next steps pay the change.
"""
from __future__ import annotations

import math
from collections.abc import Callable

# Steps after a change of shape measured apart, then steady: llama.cpp's CUDA backend captures a
# graph on the second step of a shape and replays it from the third.
AFTER = 2
EMA = 0.2  # as engine/speculation/step_cost.py: steps of one row count are steady, average about five
FRESH = 64  # steps, as step_cost.py: a steady time older than this is not compared with


class ShapeCosts:
    """Per row count, the seconds of its steps 1 .. AFTER steps into a run over its steady steps'."""

    def __init__(self) -> None:
        self.rows = 0  # rows of the last step
        self.run = 0  # ... and how many steps in a row have had that count
        self.decoded = False  # did the last step decode no prompt?
        self.measured = False  # is the current run measured (it began after a decode step, not a prompt chunk)?
        self.steps = 0
        self.steady: dict[int, tuple[float, int]] = {}  # rows -> (seconds past AFTER steps into a run, step)
        self.excess: dict[int, list[float | None]] = {}  # rows -> seconds over steady at 1 .. AFTER steps in

    def age(self, rows: int) -> int:
        """How many steps into its run a step of `rows` rows run now would be (1: a change of shape)."""
        return self.run + 1 if rows == self.rows else 1

    def step(self, rows: int, seconds: float | None) -> None:
        """A step ran with `rows` rows; `seconds` when it decoded no prompt (None for a prompt chunk:
        its cost is not a decode step's, but its shape counts)."""
        age = self.age(rows)
        if age == 1:
            self.measured = self.run > 0 and self.decoded
        self.rows, self.run, self.decoded = rows, age, seconds is not None
        self.steps += 1
        if seconds is None or seconds <= 0 or rows < 1:
            return
        if age > AFTER:
            old = self.steady.get(rows)
            self.steady[rows] = (seconds if old is None else old[0] + EMA * (seconds - old[0]), self.steps)
            return
        steady = self._steady(rows)
        if not self.measured or steady is None:
            return
        by_age = self.excess.setdefault(rows, [None] * AFTER)
        old_x, x = by_age[age - 1], seconds - steady
        by_age[age - 1] = x if old_x is None else old_x + EMA * (x - old_x)

    def penalty(self, rows: int) -> float:
        """Seconds a draft in the coming step adds to the steps of `rows` rows after it, over what they
        would cost were the coming step one of `rows` rows too (0.0 until every age of that count was
        measured). After a draft those steps are 1, 2, ... steps into a new run; without it they go on
        from the age the coming step would have."""
        by_age = self.excess.get(rows)
        if by_age is None:
            return 0.0
        known = [x for x in by_age if x is not None]
        if len(known) < AFTER:
            return 0.0
        a = self.age(rows)
        return sum(known[j - 1] - (known[a + j - 1] if a + j <= AFTER else 0.0) for j in range(1, AFTER + 1))

    def hold(self, rows: int, gap: float, shape: Callable[[int], float]) -> bool:
        """Does padding a step of `rows` rows up to the current run's count cost less than leaving the
        run? Held, each of the next `gap` steps (until a draft would change the shape anyway) pays
        what the run's count costs steadily over `rows`'s, and the run finishes settling; left, the
        steps at `rows` pay its change. A count not measured (steady, or every age of a change) is
        scaled from the nearest measured one by `shape`, the verification table's cost of a count
        (as engine/speculation/step_cost.py predicts a count from another)."""
        top = self.rows
        if top <= rows or not self.decoded:  # (a prompt chunk's rows are not a shape drafts can keep)
            return False
        s_top, s_mine = self._steady(top), self._steady(rows)
        if s_top is None and s_mine is None:
            return False
        s_mine = s_mine if s_mine is not None else s_top * shape(rows) / shape(top)  # type: ignore[operator]
        s_top = s_top if s_top is not None else s_mine * shape(top) / shape(rows)
        fell = self._change(rows, shape)
        if fell is None:
            return False
        est = self._change(top, shape) or fell
        up = [x if x is not None else e for x, e in zip(self.excess.get(top) or est, est)]
        settling = sum(up[min(self.run, AFTER):])  # the run's change is paid; what is left of its settling
        return gap * (s_top - s_mine) + settling < sum(fell)

    def _steady(self, rows: int) -> float | None:
        """The steady seconds of `rows` rows, if measured at most FRESH steps ago."""
        got = self.steady.get(rows)
        return got[0] if got is not None and self.steps - got[1] <= FRESH else None

    def _change(self, rows: int, shape: Callable[[int], float]) -> list[float] | None:
        """What a change to `rows` costs the steps 1 .. AFTER into the new run: measured, else scaled
        from the nearest count measured at every age (None: none is)."""
        known = [(abs(math.log(r / rows)), r) for r, x in self.excess.items() if None not in x]
        if not known:
            return None
        _, r = min(known)
        f = shape(rows) / shape(r)
        return [x * f for x in self.excess[r]]  # type: ignore[operator]
