"""Where four clients' time goes, in-process: prompt steps, decode steps and the step loop's own time.

bench/batch.py part 6 measures four clients through the engine process and prints a bound on what
lookup could reach, from part 1's row prices; the part of the plain wall those rows do not explain is
taken as fixed at one end and as going with the steps at the other. This bench splits that rest. It
runs the same step loop in this process (tests/engine/live.py, the worker's `BatchEngine`) on four
of part 6's prompts at once, 128 tokens each, with adaptive lookup and without, and times every step:

- prompt steps: steps in which a sequence was waiting or prefilling before the step (their
  `llama_decode` carries prompt rows; the sequences already decoding ride along);
- decode steps: the others (one row per sequence plus its draft rows);
- the loop: each step's time outside `llama_decode` (scheduling, sampling, verification, drafting,
  the events), summed over both kinds.

Each configuration runs twice in a row: cold (an empty KV cache, every prompt evaluated) and warm (the
same prompts again, found in the prefix cache, as part 6's repeated prompts mostly are). With
`--idle-prompts N` each cold run starts after N other prompts (1,300 words each: 1,375 tokens for
SmolLM2, 1,306 for the starter; the count is printed) were answered and left cached in idle slots, as
a server's earlier conversations are: in llama.cpp's unified KV cache every decode step walks every
cell up to the highest one in use, the idle ones masked, so this prices them. The order of
the two modes alternates by round; prompts rotate by round as part 6's do; one plain run before round 1
is not counted (it leaves the engine's chunk sizer measured, as a server's is after its first prompts).
Printed: every run, then per mode and cache the sums and tok/s, and lookup / plain.

    .venv/bin/python bench/batch_trace.py [MODEL] [--rounds 4] [--work tuned|heldout|heldout2] [--kind copy|free]
        [--idle-prompts N] [--plain-only]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import SERVE_SPECULATION, WORK, serve_settings, text
from ggufdesk.engine.batching.sequence import SequenceStatus
from ggufdesk.engine.speculation.verify_cost import Calibration
from tests.engine.live import Live

TOKENS = 128
FIELDS = ("tokens", "accepted", "steps", "prompt_steps", "wall", "prompt_s", "decode_s", "loop_s")


def name(lookup: bool, idle: int) -> str:
    return ("lookup" if lookup else "plain") + (f" beside {idle} idle cached prompts" if idle else "")


def rate(a: dict[str, float]) -> float:
    return a["tokens"] / a["wall"]


def decode_ms(a: dict[str, float]) -> float:
    """A decode step's llama_decode, ms (the steps without prompt rows)."""
    return 1000 * a["decode_s"] / max(1.0, a["steps"] - a["prompt_steps"])


def one_run(live: Live, work: list, r: int, lookup: bool, costs: dict[int, float] | None,
            timed: dict[str, float]) -> dict[str, float]:
    """Four of `work`'s prompts (round r's) at once through the step loop; the step split."""
    seqs = []
    for i in range(4):
        w = work[(4 * r + i) % len(work)]
        toks = live.tokens(w.prompt)
        d = live.lookup(toks, costs=costs, adaptive=True, k_max=16, lookup_history=False) if lookup else None
        seqs.append(live.sequence(toks, TOKENS, drafter=d, temperature=w.temperature, seed=1 + i,
                                  stop=("never-stop-here",)))
    live.events.clear()
    for s in seqs:
        live.engine.submit(s)
    out = dict.fromkeys(FIELDS, 0.0)
    reading = (SequenceStatus.WAITING, SequenceStatus.PREFILLING)
    while live.engine.busy:
        prompt = any(s.status in reading for s in seqs)
        timed["decode"] = 0.0
        t = time.perf_counter()
        live.engine.step()
        wall = time.perf_counter() - t
        out["steps"] += 1
        out["wall"] += wall
        out["loop_s"] += wall - timed["decode"]
        if prompt:
            out["prompt_steps"] += 1
            out["prompt_s"] += timed["decode"]
        else:
            out["decode_s"] += timed["decode"]
    for s in seqs:
        res = live.result(s.rid)
        out["tokens"] += len(res.tokens)
        out["accepted"] += res.stats.accepted if res.stats else 0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="tuned", choices=list(WORK))
    ap.add_argument("--kind", default="copy", choices=("copy", "free"))
    ap.add_argument("--idle-prompts", type=int, default=0, help="other prompts left cached before each run")
    ap.add_argument("--plain-only", action="store_true", help="without lookup only (with --idle-prompts: "
                    "each round runs plain with and without the idle cells)")
    args = ap.parse_args()
    if args.model is None:
        from ggufdesk.core.starter import starter_model_path

        args.model = str(starter_model_path())
    work = WORK[args.work][0 if args.kind == "copy" else 1]
    print(f"model {Path(args.model).name}; work {args.work} {args.kind}; {args.rounds} rounds; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    th = args.threads
    live = Live(args.model, serve_settings(n_threads=th, n_threads_batch=th))
    cal = Calibration(live.lm, int(SERVE_SPECULATION["k_max"]))  # the verification table, as the worker measures it
    while not cal.done:
        cal.step()
    costs = cal.costs
    live.engine.set_verify_costs(costs)
    live.forget()
    timed = {"decode": 0.0}
    real = live.engine.runner.decode

    def decode(ctx: Any, batch: Any) -> int:
        t = time.perf_counter()
        rc = real(ctx, batch)
        timed["decode"] += time.perf_counter() - t
        return rc

    live.engine.runner.decode = decode
    sums: dict[tuple[str, str], dict[str, float]] = {}
    idle = args.idle_prompts
    if idle:
        idle_tokens = sum(len(live.tokens(text(1300, f"idle0.{j}"))) for j in range(idle))
        print(f"{idle} idle prompts: {idle_tokens} tokens")
    # (lookup, idle cached prompts) per configuration: plain and lookup, or with --plain-only plain without
    # and with the idle cells
    configs = [(False, idle), (True, idle)] if not args.plain_only else [(False, 0), (False, idle)][:1 + bool(idle)]
    try:
        # one run not counted: the chunk sizer sizes prompt chunks from measured steps, and before any it uses
        # a fixed fallback (95 tokens beside one stream where the measured size is 31), which only round 1's
        # first configuration would get
        one_run(live, work, 0, False, costs, timed)
        for r in range(args.rounds):
            for lookup, n_idle in configs if r % 2 == 0 else configs[::-1]:
                live.forget()
                for j in range(n_idle):  # earlier conversations, answered and left in idle slots
                    live.plain(text(1300, f"idle{r}.{j}"), 1)
                for cache in ("cold", "warm"):
                    out = one_run(live, work, r, lookup, costs, timed)
                    acc = sums.setdefault((name(lookup, n_idle), cache), dict.fromkeys(FIELDS, 0.0))
                    for k in FIELDS:
                        acc[k] += out[k]
                    print(f"  round {r + 1} {name(lookup, n_idle)} {cache}: {out['tokens']:.0f} tokens "
                          f"({out['accepted']:.0f} accepted) in {out['steps']:.0f} steps ({out['prompt_steps']:.0f} "
                          f"with prompt rows), {out['wall']:.2f} s: prompt steps' decode {out['prompt_s']:.2f} s, "
                          f"decode steps' {out['decode_s']:.2f} s ({decode_ms(out):.1f} ms a step), the loop "
                          f"{out['loop_s']:.2f} s ({1000 * out['loop_s'] / out['steps']:.2f} ms a step); "
                          f"{rate(out):.1f} tok/s", flush=True)
    finally:
        live.close()
    print("\n| mode | cache | tok/s | steps | prompt steps' decode | decode steps' | a decode step | the loop "
          "| the loop a step |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (mode, cache), a in sorted(sums.items()):
        print(f"| {mode} | {cache} | {rate(a):.1f} | {a['steps']:.0f} | {a['prompt_s'] / a['wall']:.0%} "
              f"| {a['decode_s'] / a['wall']:.0%} | {decode_ms(a):.1f} ms | {a['loop_s'] / a['wall']:.1%} "
              f"| {1000 * a['loop_s'] / a['steps']:.2f} ms |")
    (base_l, base_i), (other_l, other_i) = configs[0], configs[-1]
    for cache in ("cold", "warm"):
        p, q = sums[(name(base_l, base_i), cache)], sums[(name(other_l, other_i), cache)]
        per_decode = q["tokens"] / q["decode_s"] / (p["tokens"] / p["decode_s"])
        print(f"   {cache}: {name(other_l, other_i)} / {name(base_l, base_i)}: {rate(q) / rate(p):.2f}x; tokens over "
              f"decode steps' llama_decode time (prompt steps left out) {per_decode:.2f}x")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
