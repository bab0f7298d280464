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

So the planner measures it instead of knowing the backend: the seconds of decode steps of each row
count by how many steps in a row have had that count (`ShapeCosts.step`), and a draft that breaks a
run is charged what the steps after it will pay over the run's going on (`penalty`). Where the steps
after a change cost what the others do (a CPU, whose kernels keep no state between calls; a modelled
clock) the charge is nothing, to run-to-run noise.
"""
from __future__ import annotations

# Steps after a change of shape measured apart, then steady: llama.cpp's CUDA backend captures a
# graph on the second step of a shape and replays it from the third.
AFTER = 2
EMA = 0.2  # as engine/speculation/step_cost.py: steps of one row count and age are steady, average about five


class ShapeCosts:
    """Seconds of decode steps by row count and age (steps in a row with that count, up to AFTER + 1)."""

    def __init__(self) -> None:
        self.rows = 0  # rows of the last step
        self.run = 0  # ... and how many steps in a row have had that count
        self.seconds: dict[int, list[float | None]] = {}  # rows -> seconds at age 1 .. AFTER, and steady

    def age(self, rows: int) -> int:
        """The age a step of `rows` rows run now would have (1: its shape differs from the last step's)."""
        return self.run + 1 if rows == self.rows else 1

    def step(self, rows: int, seconds: float | None) -> None:
        """A step ran with `rows` rows; `seconds` when it decoded no prompt (a prompt chunk's cost is
        not a decode step's, but its shape counts: the step after it is a change)."""
        age = self.age(rows)
        self.rows, self.run = rows, age
        if seconds is None or seconds <= 0 or rows < 1:
            return
        by_age = self.seconds.setdefault(rows, [None] * (AFTER + 1))
        i = min(age, AFTER + 1) - 1
        old = by_age[i]
        by_age[i] = seconds if old is None else old + EMA * (seconds - old)

    def penalty(self, rows: int) -> float:
        """Seconds a draft in the coming step adds to the steps of `rows` rows after it, over what they
        would cost were the coming step one of `rows` rows too (0.0 until every age of that count was
        measured). After a draft those steps are 1, 2, ... steps into a new run; without it they go on
        from the age the coming step would have."""
        by_age = self.seconds.get(rows)
        if by_age is None:
            return 0.0
        costs = [c for c in by_age if c is not None]
        if len(costs) < len(by_age):
            return 0.0
        a = self.age(rows)
        return sum(costs[min(j, AFTER + 1) - 1] - costs[min(a + j, AFTER + 1) - 1] for j in range(1, AFTER + 1))
