"""Lookup on a modelled GPU clock: the engine's own step loop and Python, llama_decode's time replaced.

A stand-in for a GPU this project is not always lent (docs/bench/speculative-decoding.md, "A change of
shape"): the held-out suite runs through the real engine (tests/engine/live.py) on SmolLM2, and every
decode call is charged what llama.cpp's CUDA backend would take by its rule for graphs — a step shaped
unlike the one before runs without the graph (DIRECT), the second of a shape captures it (DIRECT +
CAPTURE), the third on replays it (REPLAY) — times the verification table the lent H200 measured at load
(docs/bench/runs/2026-12-04/gpu/verify_costs.json: every shape timed once a round, so graph-less).
Everything else (lookup's search, the planner, sampling) costs what it costs on this CPU. The times
are a model, its one-row figures guesses around what the H200 showed (800 tok/s one stream, most of
the step launching kernels); print them beside any figure taken from it.

    .venv/bin/python bench/graph_clock.py [--suite heldout|tuned] [--categories free-de,explain-en]
        [--rounds 2] [--streams 1] [--replay-ms 1.0] [--direct-ms 1.8] [--capture-ms 0.4] [--split]
        [--real] [--gpu-layers 0] [--threads 2] [--python-free]

`--split` also says where a decode step's time went, plain against adaptive: the modelled decode (and
how many steps ran without a graph), the engine's own Python (everything else, real time), and of it
the garbage collector's pauses (engine/runtime/heap.py). `--real` keeps the real clock instead, decode
included (`--gpu-layers -1 --threads 8` on a lent GPU: bench/gpu_lookup.sh), and the split then says
what the engine's Python costs beside a real decode (the graph-less share is still llama.cpp's rule
applied to the steps' shapes).

`--python-free` counts the modelled decode alone: the engine's Python costs nothing, so a look costs
nothing (no drafter rests) and a tree's run is the same every time. It weighs the drafting decisions
and the graph rule apart from this CPU's Python, whose real-time cost feeds back into the decisions and
makes runs of one tree differ by more than most changes move them (one tree read 0.64x and 2.18x plain
on one held-out prompt: docs/bench/speculative-decoding.md, session 22). Between two trees even plain
decoding's figures move (presumably what the runs before a prompt leave in the engine's caches), so a
difference is still read over many prompts.

Weigh a change on the tuned suite first (`--suite tuned`), then read the held-out one.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp

from bench.spec_heldout import SUITES, model_path, prompt_text
from ggufdesk.core.settings import LoadSettings

TABLE_FILE = Path(__file__).resolve().parents[1] / "docs/bench/runs/2026-12-04/gpu/verify_costs.json"


class GraphClock:
    """The step loop's timer: wall time, less each decode call's real time, plus its modelled one (with
    `real`, wall time itself: on a GPU, what the split of a step really is)."""

    def __init__(self, table: dict[int, float], replay: float, direct: float, capture: float, *,
                 real: bool = False) -> None:
        self.table, self.replay, self.direct, self.capture = table, replay, direct, capture
        self.real = real  # (--real: wall time throughout; `spent` holds the decode calls' real time)
        self.offset = 0.0
        self.shapes: list[tuple[int, int]] = [(0, 0), (0, 0)]
        self.spent: list[float] = [0.0, 0, 0]  # modelled decode seconds, decode calls, graph-less ones among them

    def __call__(self) -> float:
        return time.perf_counter() - self.offset

    def ratio(self, rows: int) -> float:
        if rows <= 1:
            return 1.0
        top = max(self.table)
        return self.table.get(rows - 1, self.table[top] * (rows - 1) / top)

    def modelled(self, rows: int, logits: int) -> float:
        shape = (rows, logits)
        before, last = self.shapes[-2:]
        self.shapes = [last, shape]
        graph = shape == last == before
        t = self.replay * self.ratio(rows) if graph else \
            self.direct * self.ratio(rows) + (self.capture if shape == last else 0.0)
        self.spent = [self.spent[0] + t, self.spent[1] + 1, self.spent[2] + (not graph)]
        return t

    def decode(self, ctx: Any, batch: Any) -> int:
        t = time.perf_counter()
        rc = int(llama_cpp.llama_decode(ctx, batch))
        real = time.perf_counter() - t
        logits = sum(1 for i in range(batch.n_tokens) if batch.logits[i])
        modelled = self.modelled(batch.n_tokens, logits)
        if self.real:  # the real clock: the decode's own time is counted, the rule's only its shapes
            self.spent[0] += real - modelled
        else:
            self.offset += real - modelled
        return rc


class Pauses:
    """gc.callbacks: the collector's pauses (seconds, collections, full ones) by (category, mode)."""

    def __init__(self) -> None:
        self.key: tuple[str, str] = ("", "")
        self.by: dict[tuple[str, str], list[float]] = {}
        self._t = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        g = self.by.setdefault(self.key, [0.0, 0, 0])
        g[0] += time.perf_counter() - self._t
        g[1] += 1
        g[2] += info["generation"] == 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="heldout", choices=list(SUITES))
    ap.add_argument("--categories", default="", help="the suite's categories (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=1, help="concurrent requests of each prompt")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--replay-ms", type=float, default=1.0)
    ap.add_argument("--direct-ms", type=float, default=1.8)
    ap.add_argument("--capture-ms", type=float, default=0.4)
    ap.add_argument("--split", action="store_true", help="also where each decode step's time went")
    ap.add_argument("--real", action="store_true", help="the real clock, decode included (on a GPU)")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--python-free", action="store_true", help="count the modelled decode alone (deterministic)")
    args = ap.parse_args()
    if args.rounds < 1 or args.streams < 1 or min(args.replay_ms, args.direct_ms, args.capture_ms) < 0:
        ap.error("--rounds and --streams >= 1, times >= 0")
    if args.threads < 1 or args.gpu_layers < -1:
        ap.error("--threads >= 1, --gpu-layers >= -1")
    if args.real and args.python_free:
        ap.error("--real and --python-free: one clock or the other")
    from tests.engine.live import Live, ModelClock

    table = {int(k): float(v) for k, v in next(iter(json.loads(TABLE_FILE.read_text()).values())).items()}
    graph = GraphClock(table, args.replay_ms / 1e3, args.direct_ms / 1e3, args.capture_ms / 1e3, real=args.real)
    clock: Any = ModelClock(graph.modelled) if args.python_free else graph
    live = Live(model_path("smollm2"), LoadSettings(n_ctx=4096 * args.streams, n_threads=args.threads,
                                                   n_threads_batch=args.threads, n_parallel=args.streams,
                                                   n_gpu_layers=args.gpu_layers), clock=clock, costs=table)
    cats = [c for c in args.categories.split(",") if c]
    ws = [w for w in SUITES[args.suite] if not cats or w.category in cats]
    res: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
    split: dict[tuple[str, str], list[float]] = {}  # seconds, modelled decode seconds, steps, graph-less, tokens
    pauses = Pauses()
    gc.callbacks.append(pauses)
    for rnd in range(args.rounds):
        for w in ws:
            for mode in ("plain", "adaptive") if rnd % 2 == 0 else ("adaptive", "plain"):
                toks = live.tokens(prompt_text(w, True))
                seqs = [live.sequence(toks, args.max_tokens, temperature=w.temperature, seed=1 + i + 10 * rnd,
                                      drafter=None if mode == "plain" else live.lookup(toks, k_max=16, adaptive=True))
                        for i in range(args.streams)]
                for s in seqs:
                    live.engine.submit(s)
                first, n0, spent0 = None, 0, graph.spent
                pauses.key = ("", "")  # (prefill's pauses are not a decode step's)
                while live.engine.busy:
                    live.engine.step()
                    if first is None and all(s.stats.n_gen >= 1 for s in seqs):  # decode only, from here
                        first, n0, spent0 = clock(), sum(s.stats.n_gen for s in seqs), graph.spent
                        pauses.key = (w.category, mode)
                pauses.key = ("", "")
                n = sum(s.stats.n_gen for s in seqs) - n0
                rate = n / (clock() - first) if first is not None and n > 0 else 0.0
                if first is not None:
                    got = [clock() - first] + [a - b for a, b in zip(graph.spent, spent0)] + [n]
                    split[(w.category, mode)] = [a + b for a, b in zip(split.get((w.category, mode), [0.0] * 5), got)]
                res.setdefault((w.category, mode), []).append(
                    (rate, sum(s.stats.drafted for s in seqs), sum(s.stats.accepted for s in seqs)))
                for s in seqs:
                    live.result(s.rid)
                live.forget()
    live.close()
    on = f"the real clock ({args.gpu_layers} GPU layers, {args.threads} threads)" if args.real else \
        f"a modelled GPU clock (one-row step: replayed {args.replay_ms} ms, graph-less {args.direct_ms} ms, " \
        f"capture +{args.capture_ms} ms{'; the Python free' if args.python_free else ''})"
    print(f"SmolLM2 on {on}, {args.streams} stream(s), {args.rounds} rounds, medians")
    clocked = "real" if args.real else "modelled"
    for c in dict.fromkeys(w.category for w in ws):
        p = statistics.median(r[0] for r in res[(c, "plain")])
        a = statistics.median(r[0] for r in res[(c, "adaptive")])
        drafts = ", ".join(f"{d}/{acc}" for _, d, acc in res[(c, "adaptive")])
        print(f"{c:11s} plain {p:6.0f} adaptive {a:6.0f} tok/s ({clocked}) = {a / p:.2f}x plain; "
              f"drafted/accepted {drafts}")
    if args.split:
        kind, graphless = ("real", "of shapes without a graph by llama.cpp's rule") if args.real else \
            ("modelled", "without a graph")
        print(f"where a decode step's time went, all rounds: {kind} decode + the engine's Python (real time)")
        for (c, mode), (wall, model, steps, direct, n) in split.items():
            py = wall - model
            if steps:
                g = pauses.by.get((c, mode), [0.0, 0, 0])
                print(f"  {c:11s} {mode:8s} {steps:5.0f} steps, {n / steps:.2f} tokens a step: decode "
                      f"{model / steps * 1e6:5.0f} us ({direct / steps:.0%} {graphless}), Python "
                      f"{py / steps * 1e6:4.0f} us a step ({py / max(n, 1) * 1e6:.0f} us a token); of it the "
                      f"collector {g[0] / steps * 1e6:.0f} us ({g[1]:.0f} collections, {g[2]:.0f} full)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
