"""How close adaptive prompt lookup comes to the best any lookup policy could do, per category of the suite.

bench/speculative.py measures wall time. This replays instead: each greedy prompt of
bench/spec_workloads.py is answered once by plain decoding (the starter, on the engine's step loop in
process, tests/engine/live.py); then the
engine's own drafter (`engine/speculation/lookup.py`: adaptive, and fixed K) is driven over that answer with
each step charged what this machine measured for its row count (a verification decode at a
400-token context, rows 1 to 32; a plain step = 1). Greedy speculation emits exactly the plain
answer, so the replay needs no model, and every policy is charged the same costs.

The **oracle** knows, at every position, how many of the lookup's drafted tokens the model will
accept, and picks each step's length (0 or one of `--lengths`) by dynamic programming to spend the
least: no online policy drafting from the same n-gram lookup can beat it at these costs. The gap
between adaptive and oracle is what better judgement could still win; the oracle itself is the
ceiling of prompt lookup on this CPU.

Two more columns say where the gap lies and what the ceiling is made of. **short foresight** is
adaptive with one change: at a match shorter than SHORT tokens (where a copied stretch starts, the
match is one or two tokens long) it knows how many drafted tokens will be accepted and drafts the
best measured length for that, or nothing; everywhere else it judges as the engine does. The cost
line also gives the same rows with logits for the last row only: what the vocabulary's output
layer (262,144 tokens for the starter) adds to every verified row on a CPU, and a one-row step
with and without its logits, what that layer costs a plain step.

    .venv/bin/python bench/spec_oracle.py [--categories rag,code] [--max-tokens 96] [--lengths 1,3,7,15]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_workloads import CATEGORIES, WORKLOADS

from ggufdesk.core.settings import LoadSettings
from ggufdesk.core.starter import starter_model_path
from ggufdesk.engine.speculation.lookup import NgramCache, PromptLookup

ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32)
CONTEXT = 400  # tokens in the KV cache while the costs are measured (a prompt of the suite's size)
SHORT = 3  # matches shorter than this get foresight in the "short foresight" replay


def decode_times(lm, cases: list[tuple[int, str]], reps: int) -> list[float]:
    """Median seconds of each case's decode at CONTEXT tokens, the cases interleaved in every pass (the
    first pass warms up). A case is (rows, which rows want logits: "every", "last" or "none")."""
    import llama_cpp
    from llama_cpp import _internals as internals

    from ggufdesk.engine.batching.runner import fill_batch

    mem = llama_cpp.llama_get_memory(lm.ctx.ctx)
    llama_cpp.llama_memory_clear(mem, True)
    batch = internals.LlamaBatch(n_tokens=max(CONTEXT, *(r for r, _ in cases)), embd=0, n_seq_max=1)
    for i in range(0, CONTEXT, lm.settings.n_batch):  # the context the rows attend to
        n = min(lm.settings.n_batch, CONTEXT - i)
        fill_batch(batch, [(1000 + i + j, i + j, 0, False) for j in range(n)])
        llama_cpp.llama_decode(lm.ctx.ctx, batch.batch)
    times: list[list[float]] = [[] for _ in cases]
    for rep in range(reps + 1):
        for (r, logits), ts in zip(cases, times):
            fill_batch(batch, [(500 + i, CONTEXT + i, 0, logits == "every" or (logits == "last" and i == r - 1))
                               for i in range(r)])
            t = time.perf_counter()
            llama_cpp.llama_decode(lm.ctx.ctx, batch.batch)
            dt = time.perf_counter() - t
            llama_cpp.llama_memory_seq_rm(mem, 0, CONTEXT, -1)
            if rep:
                ts.append(dt)
    llama_cpp.llama_memory_clear(mem, True)
    return [statistics.median(ts) for ts in times]


def measure_costs(lm, reps: int = 4, *, every_row: bool = True) -> dict[int, float]:
    """k -> seconds of a decode of k + 1 rows with logits (for every row, or for the last only) / a
    one-row decode's, at CONTEXT tokens."""
    times = decode_times(lm, [(r, "every" if every_row else "last") for r in ROWS], reps)
    one = times[ROWS.index(1)]
    return {r - 1: t / one for r, t in zip(ROWS, times)}


def one_row_ms(lm, reps: int = 10) -> tuple[float, float]:
    """Milliseconds of a one-row decode at CONTEXT tokens with its logits and without (no output
    layer at all): what the vocabulary's output layer costs a plain step."""
    with_head, without = decode_times(lm, [(1, "every"), (1, "none")], reps)
    return with_head * 1e3, without * 1e3


def cost(table: dict[int, float], k: int) -> float:
    if k == 0:
        return 1.0
    if k in table:
        return table[k]
    lo = max(j for j in table if j < k)
    hi = min((j for j in table if j > k), default=None)
    if hi is None:
        return table[lo] * k / lo
    return table[lo] + (table[hi] - table[lo]) * (k - lo) / (hi - lo)


def replay(prompt: list[int], out: list[int], drafter, table: dict[int, float],
           counts: list[int] | None = None, on_draft: Callable[[int, int, int], None] | None = None) -> float:
    """Tokens per plain-step cost of `drafter` over the answer `out` (the first token comes from prefill);
    `counts` ([drafted, accepted]) adds up the drafted and accepted tokens; `on_draft(i, drafted, accepted)`
    hears of every draft, made to write out[i] on."""
    i, spent, n = 1, 0.0, len(out)
    while i < n:
        k = min(drafter.k, n - i - 1)
        draft = drafter.propose(prompt + out[:i - 1], out[i - 1], k)[:k] if k > 0 else []
        a = 0
        while a < len(draft) and draft[a] == out[i + a]:
            a += 1
        c = cost(table, len(draft))
        spent += c
        if on_draft is not None and draft:
            on_draft(i, len(draft), a)
        if counts is not None:
            counts[0] += len(draft)
            counts[1] += a
        drafter.feedback(len(draft), a, c * 0.0167)  # seconds: any scale, the controller compares ratios
        i += a + 1
    return (n - 1) / spent


class ShortForesight(PromptLookup):
    """Adaptive lookup that knows the answer at matches shorter than SHORT tokens (see the docstring)."""

    def __init__(self, prompt: list[int], out: list[int], table: dict[int, float], lengths: list[int],
                 **kw) -> None:
        super().__init__(**kw)
        self.prompt_len, self.out, self.table, self.lengths = len(prompt), out, table, lengths

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        draft = super().propose(history, last, k)
        n, c, m = self.cache.match()
        if not n or m >= SHORT:
            return draft
        i = len(history) + 1 - self.prompt_len  # the position in the answer being drafted
        cont = self.cache.continuation(c, k, loop=True)
        a = 0
        while a < len(cont) and i + a < len(self.out) and cont[a] == self.out[i + a]:
            a += 1
        rate = {j: (min(j, a) + 1) / cost(self.table, j) for j in self.lengths if j <= len(cont)}
        best = max(rate, key=lambda j: rate[j], default=0)
        self._last_m, self._end_at = m, -1  # this draft's outcome says nothing about sentence ends
        return cont[:best] if best and rate[best] > 1.0 else []


def oracle(prompt: list[int], out: list[int], table: dict[int, float], lengths: list[int]) -> float:
    cache, n, avail = NgramCache(3), len(out), []
    for i in range(n):
        cache.feed(prompt + out[:i])
        ng, c, _ = cache.match()
        cont = cache.continuation(c, max(lengths), loop=True) if ng else []
        a = 0
        while a < len(cont) and i + a < n and cont[a] == out[i + a]:
            a += 1
        avail.append(a)
    best = [0.0] * (n + 1)
    for i in range(n - 1, 0, -1):
        best[i] = min(cost(table, k) + best[min(n, i + min(k, avail[i]) + 1)] for k in [0] + lengths)
    return (n - 1) / best[1]


def gmean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lengths", default="1,3,7,15", help="draft lengths the oracle may choose")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from ggufdesk.engine.speculation.speculative import Numbers, QuoteMarks, SentenceEnds
    from ggufdesk.engine.speculation.verify_cost import Calibration
    from tests.engine.live import Live

    s = LoadSettings(n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads)
    live = Live(starter_model_path(), s, n_outputs=max(ROWS) + 1)  # the engine's step loop, in process
    lm = live.lm
    table = measure_costs(lm)
    last_only = measure_costs(lm, every_row=False)
    cal = Calibration(lm, 16)  # what the engine itself measures at load (an empty KV cache)
    while not cal.done:
        cal.step()
    ends, quotes, nums = SentenceEnds(lm), QuoteMarks(lm), Numbers(lm)
    print("verification cost at a 400-token context (plain steps): "
          + ", ".join(f"{k + 1} rows {c:.2f}" for k, c in sorted(table.items()) if k))
    print("the same rows, logits for the last row only: "
          + ", ".join(f"{k + 1} rows {c:.2f}" for k, c in sorted(last_only.items()) if k))
    with_head, without = one_row_ms(lm)
    print(f"a one-row step: {with_head:.1f} ms with its logits, {without:.1f} ms without "
          f"(the output layer: {1 - without / with_head:.0%} of a plain step)")
    print("the engine's own measurement at load: " + ", ".join(f"k={k} {c:.2f}" for k, c in (cal.costs or {}).items()))
    lengths = [int(x) for x in args.lengths.split(",")]
    cats = args.categories.split(",")
    rows: dict[str, list[tuple[float, float, float, float]]] = {}  # (adaptive, best K, oracle, short foresight)
    for w in WORKLOADS:
        if w.category not in cats or w.temperature:
            continue
        live.forget()
        prompt = live.tokens(w.prompt)
        out = live.plain(prompt, args.max_tokens).tokens  # plain decoding on the live loop
        if len(out) < 2:
            print(f"  {w.category}/{w.name}: skipped (a {len(out)}-token answer)", file=sys.stderr)
            continue
        adaptive = PromptLookup(ngram=3, k_min=1, k_max=16, adaptive=True, costs=cal.costs, ends_sentence=ends,
                                quote_marks=quotes, numbers=nums)
        ad = replay(prompt, out, adaptive, table)
        fixed = {k: replay(prompt, out, PromptLookup(ngram=3, k_min=1, k_max=k, adaptive=False), table)
                 for k in (4, 8, 16)}
        kb = max(fixed, key=lambda k: fixed[k])
        bound = oracle(prompt, out, table, lengths)
        seer = ShortForesight(prompt, out, table, [j for j in (cal.costs or {}) if j in lengths], ngram=3,
                              k_min=1, k_max=16, adaptive=True, costs=cal.costs, ends_sentence=ends,
                              quote_marks=quotes, numbers=nums)
        short = replay(prompt, out, seer, table)
        rows.setdefault(w.category, []).append((ad, fixed[kb], bound, short))
        print(f"  {w.category}/{w.name}: adaptive {ad:.2f}, best fixed {fixed[kb]:.2f} (K={kb}), "
              f"short foresight {short:.2f}, oracle {bound:.2f}", file=sys.stderr, flush=True)
    print(f"\nreplayed × plain (geometric mean over a category's prompts; oracle lengths {lengths}):")
    print(f"{'category':14s} {'adaptive':>9s} {'best K':>7s} {'short foresight':>16s} {'oracle':>7s} "
          f"{'adaptive/oracle':>16s}")
    for cat, rs in rows.items():
        ad, bk, orc, short = (gmean([r[i] for r in rs]) for i in (0, 1, 2, 3))
        print(f"{cat:14s} {ad:9.2f} {bk:7.2f} {short:16.2f} {orc:7.2f} {ad / orc:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
