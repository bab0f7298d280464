"""What speculation's bookkeeping costs a step, against a GPU step: resting drafters and looks, in microseconds.

On a GPU a small model's step is about a millisecond (SmolLM2 on the lent H200: 800 tok/s one stream),
so the Python the step loop runs for each drafter counts: beside three others, four drafters that only
keep count cost a step some percent (docs/bench/speculative-decoding.md, "What resting costs"). This
times, warm, outside the model: the planner's plan + settle for N lookup drafters resting (no look
due), and one look (pricing aside: propose on a real free-writing answer at every position); with
`--contexts`, the same look after that many tokens of earlier conversation, and what a draft model's
sync with the request's text compares each step (core/prompt_cache.py: common_prefix, against a
token-at-a-time loop): per-step costs that grow with the context.

    .venv/bin/python bench/bookkeeping.py [--drafters 1,4] [--rounds 5] [--contexts 1024,4096,16384]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggufdesk.core.prompt_cache import common_prefix
from ggufdesk.engine.batching.runner import SeqOutput, StepResult
from ggufdesk.engine.batching.scheduler import DecodeRow, Plan
from ggufdesk.engine.speculation.lookup import PromptLookup
from ggufdesk.engine.speculation.step_cost import StepCosts

STEPS = 2000
GPU_STEP_US = 1000.0  # a one-row step on the lent H200 (docs/bench/runs/2026-12-04/gpu)


def resting(n: int, rounds: int) -> float:
    """Microseconds of plan + settle per step for n resting lookup drafters (the loop's own cost taken off)."""
    from tests.engine.test_step_cost import TABLE, planner, seq

    pl = planner(StepCosts(TABLE))
    seqs = []
    for i in range(n):
        s = seq(i, PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=TABLE))
        s.max_gen = 1 << 30
        seqs.append(s)

    def step(t: int, run: bool) -> None:
        p = Plan(decode=[DecodeRow(s) for s in seqs])
        res = StepResult(outputs=[SeqOutput(seq=s, tokens=[7]) for s in seqs], seconds=0.010 * (1 + 0.01 * (t % 3)),
                         rows=n, n_prompt=0)
        if run:
            pl.plan(p)
            pl.settle(p, res)
        for s in seqs:
            s.stats.n_gen += 1

    for t in range(50):
        step(t, True)
    for s in seqs:  # resting: no look due
        assert s.drafter is not None
        s.drafter.control.look_at = 1 << 30
    per: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for run in (True, False):
            t0 = time.perf_counter()
            for t in range(STEPS):
                step(t, run)
            per[run].append((time.perf_counter() - t0) / STEPS * 1e6)
    return statistics.median(per[True]) - statistics.median(per[False])


def looks(rounds: int, context: int = 0) -> tuple[int, float]:
    """(looks, median microseconds of one) on SmolLM2's greedy answer to a held-out free-writing prompt,
    after `context` tokens of earlier conversation (drawn from the answer's own tokens)."""
    from bench.spec_heldout import SUITES, model_path, prompt_text
    from ggufdesk.core.settings import LoadSettings
    from tests.engine.live import Live

    live = Live(model_path("smollm2"), LoadSettings(n_ctx=4096, n_threads=2, n_threads_batch=2))
    w = next(w for w in SUITES["heldout"] if w.category == "explain-en")
    prompt = live.tokens(prompt_text(w, True))
    answer = live.run(live.sequence(prompt, 256))[0].tokens
    prompt = random.Random(context).choices(prompt + answer, k=context) + prompt
    text = prompt + answer
    prices = {k: 1.0 + 0.1 * k for k in range(1, 17)}
    times: list[float] = []
    for _ in range(rounds):
        d = live.lookup(prompt, k_max=16, adaptive=True, costs=prices)
        d.control.feedback(0, 0, 1.0)
        d.control.price(prices, 0.001)
        history = text[:len(prompt)]
        for i in range(len(prompt), len(text) - 1):
            t0 = time.perf_counter()
            d.propose(history, text[i], 16)
            times.append(time.perf_counter() - t0)
            history.append(text[i])  # the sequence's tokens grow in place, as a slot's do
    live.close()
    return len(text) - 1 - len(prompt), statistics.median(times) * 1e6


def _token_at_a_time(a: list[int], b: list[int]) -> int:
    """common_prefix as it was written before session 21: the reference it is timed against."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def sync_compare(context: int, rounds: int) -> tuple[float, float]:
    """Microseconds (ours, token at a time) of comparing a draft model's context with the request's text
    one step on: the text is the context plus the step's token and the next."""
    kv = [random.Random(i).randrange(49152) for i in range(context)]
    text = kv + [5, 6]
    out = []
    for f in (common_prefix, _token_at_a_time):
        assert f(kv, text) == context
        reps = max(10, 200_000 // max(context, 1))
        best = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(reps):
                f(kv, text)
            best.append((time.perf_counter() - t0) / reps * 1e6)
        out.append(statistics.median(best))
    return out[0], out[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafters", default="1,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--contexts", default="", help="also time a look and a draft model's sync after these many tokens")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.drafters.split(",") if x]
        contexts = [int(x) for x in args.contexts.split(",") if x]
    except ValueError:
        ap.error("--drafters and --contexts are lists of whole numbers")
    if args.rounds < 1 or not counts or min(counts) < 1 or min(contexts, default=0) < 0:
        ap.error("--rounds >= 1, --drafters a list of counts >= 1, --contexts of token counts >= 0")
    for n in counts:
        us = resting(n, args.rounds)
        print(f"{n} drafter(s) resting: plan + settle {us:5.1f} us a step = {us / GPU_STEP_US:.1%} of a "
              f"{GPU_STEP_US / 1e3:.1f} ms GPU step")
    n, us = looks(args.rounds)
    print(f"a look (propose, explain-en, {n} positions): median {us:5.1f} us = {us / GPU_STEP_US:.1%} of a GPU step")
    for c in contexts:
        n, us = looks(args.rounds, c)
        ours, loop = sync_compare(c, args.rounds)
        print(f"after {c:6d} tokens: a look {us:6.1f} us ({us / GPU_STEP_US:.1%} of a GPU step); a draft model's "
              f"sync compares {ours:6.1f} us (token at a time: {loop:6.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
