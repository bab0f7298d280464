"""Would the model's own confidence, or acceptance learned per model, tell lookup's failing drafts apart?

Two gates considered for SmolLM2's short free answers (docs/bench/speculative-decoding.md: free-de
0.93x, explain-en 0.96x, where one rejected 3-token draft costs 2.6 plain steps), measured here on
the tuned suite only (bench/spec_workloads.py: the held-out suites are not looked at for this):

1. **confidence**: the probability the model gave the last token written (what it knew when the
   draft was made). Copying, a model is sure of itself; if drafts made after an unsure token failed
   more often, a gate on it would save those steps.
2. **acceptance per model**: evidence.py's per-class priors were fitted to the starter; if SmolLM2
   accepted less per class, priors learned across requests would refuse its doubtful drafts.

Each greedy prompt is answered once by plain decoding (the live loop, in process); one forward pass
over prompt and answer gives every position's probabilities; the engine's adaptive lookup is then
replayed over the answer (bench/spec_oracle.py's replay, at bench/spec_heldout.py's fixed table), and
every draft it makes is recorded with its match class, the confidence before it and what was
accepted.

    .venv/bin/python bench/spec_confidence.py [--model starter|smollm2] [--max-tokens 96]
"""
from __future__ import annotations

import argparse
import bisect
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_heldout import TABLE, adaptive_lookup, model_path, prompt_text
from bench.spec_oracle import replay
from bench.spec_workloads import WORKLOADS

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 0.97, 1.01)  # confidence bins
GROUPS = ((1, 3), (3, 6), (6, 1 << 30))  # judged match lengths: short, the 3-5 classes, long


def probabilities(llm, prompt: list[int], out: list[int]) -> list[float]:
    """p(out[i] | prompt, out[:i]) for every i (one pass, logits for the answer's rows only)."""
    import numpy as np

    llm.reset()
    llm.eval(prompt + out)
    base = len(prompt) - 1
    rows = np.array(llm.scores[base:base + len(out)], dtype=np.float64)
    m = rows.max(axis=1, keepdims=True)
    logp = rows - m - np.log(np.exp(rows - m).sum(axis=1, keepdims=True))
    return [math.exp(logp[i, t]) for i, t in enumerate(out)]


def drafts(d, prompt: list[int], out: list[int], conf: list[float]) -> list[tuple[int, float, int, int]]:
    """(judged match length, confidence in the last token, drafted, accepted) of every draft the
    drafter makes over the answer (bench/spec_oracle.py's replay)."""
    got: list[tuple[int, float, int, int]] = []
    replay(prompt, out, d, TABLE, on_draft=lambda i, k, a: got.append((d._last_m, conf[i - 1], k, a)))
    return got


def report(recs: list[tuple[int, float, int, int]]) -> None:
    from ggufdesk.engine.speculation.evidence import CLASSES, PRIOR

    print(f"{len(recs)} drafts. By confidence in the last token (cells: drafts, first token accepted, "
          "drafted tokens accepted):")
    print("| match | " + " | ".join(f"{lo:.2f}-{min(hi, 1):.2f}" for lo, hi in zip(BINS, BINS[1:])) + " |")
    print("|---|" + "---:|" * (len(BINS) - 1))
    for lo_m, hi_m in GROUPS:
        cells = []
        for lo, hi in zip(BINS, BINS[1:]):
            rs = [r for r in recs if lo_m <= r[0] < hi_m and lo <= r[1] < hi]
            cells.append(f"{len(rs)}, {sum(r[3] > 0 for r in rs) / len(rs):.2f}, "
                         f"{sum(r[3] for r in rs) / sum(r[2] for r in rs):.2f}" if rs else "-")
        print(f"| {lo_m}-{hi_m - 1 if hi_m < 1 << 30 else 'up'} | " + " | ".join(cells) + " |")
    print("\nPer-token acceptance by evidence class (accepted / (accepted + drafts that failed)), against the prior:")
    print("| class | drafts | measured | prior |\n|---|---:|---:|---:|")
    for i, c in enumerate(CLASSES):
        rs = [r for r in recs if max(0, bisect.bisect_right(CLASSES, r[0]) - 1) == i]
        if rs:
            acc, fails = sum(r[3] for r in rs), sum(r[3] < r[2] for r in rs)
            print(f"| {c}+ | {len(rs)} | {acc / max(acc + fails, 1):.2f} | {PRIOR[i]} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="starter", help="starter, smollm2 or a GGUF path")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp

    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.speculation.speculative import TokenText
    from tests.engine.live import Live

    chat = args.model == "smollm2"
    path = model_path(args.model)
    live = Live(path, LoadSettings(n_ctx=8192, n_threads=args.threads, n_threads_batch=args.threads))
    text = TokenText.of(live.lm)
    # every row's logits: the starter's 262,144-token vocabulary takes 1 GB per 1,000 positions, so its
    # context is held to the suite's prompts less the long one
    llm = llama_cpp.Llama(path, n_ctx=8192 if chat else 2048, logits_all=True, n_threads=args.threads,
                          verbose=False)
    recs: list[tuple[int, float, int, int]] = []
    for w in WORKLOADS:
        prompt = live.tokens(prompt_text(w, chat))
        if w.temperature or len(prompt) + args.max_tokens > llm.n_ctx():
            continue
        live.forget()
        out = live.plain(prompt, args.max_tokens).tokens
        if len(out) < 2:
            continue
        recs += drafts(adaptive_lookup(live, prompt, TABLE, text), prompt, out, probabilities(llm, prompt, out))
        print(f"  {w.category}/{w.name}: {len(out)} tokens", file=sys.stderr, flush=True)
    print(f"\ntuned suite, {args.model}, greedy, adaptive lookup replayed at a fixed cost table\n")
    report(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
