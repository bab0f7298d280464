"""What a draft costs the one-row steps after it: llama_decode timed by how many steps in a row had its shape.

The draft planner charges a draft what changing the step's shape costs the steps after it
(app/ggufdesk/engine/speculation/shape_cost.py), measured live. This measures the same thing directly,
outside the engine: runs of one-row decode steps, each run broken by one verification-shaped step of
1 + k rows (then rolled back, as a rejected draft is), and the one-row steps' times by their age in the
run (1: just after the draft step, 2: the next, then steady). On a CPU the ages cost alike; with
llama.cpp's CUDA graphs the first two run without the graph (docs/bench/speculative-decoding.md).

    .venv/bin/python bench/shape_cost.py [--model smollm2|starter|PATH] [--gpu-layers -1] [--threads 2]
        [--k 4] [--runs 40] [--run-length 6]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch import LowLevel
from spec_heldout import model_path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--k", type=int, default=4, help="draft rows of the step that breaks each run")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--run-length", type=int, default=6, help="one-row steps after each draft step")
    args = ap.parse_args()
    if args.runs < 1 or args.run_length < 3 or args.k < 1:
        ap.error("--runs >= 1, --run-length >= 3 and --k >= 1")
    low = LowLevel(model_path(args.model), args.threads, args.gpu_layers)
    low.reset(1)
    for _ in range(8):  # warm up the one-row shape
        low.decode([(101, 0, True)])
    by_age: dict[int, list[float]] = {}
    draft: list[float] = []
    for _ in range(args.runs):
        n0 = low.pos[0]
        draft.append(low.decode([(101 + j, 0, True) for j in range(1 + args.k)]))
        low.llama_cpp.llama_memory_seq_rm(low.mem, 0, n0 + 1, -1)  # the drafts rejected: only the first row stays
        low.pos[0] = n0 + 1
        for age in range(1, args.run_length + 1):
            by_age.setdefault(min(age, 3), []).append(low.decode([(102, 0, True)]))
        if low.pos[0] > 7000:
            low.reset(1)
    steady = statistics.median(by_age[3])
    print(f"{args.model}, gpu layers {args.gpu_layers}, {args.threads} threads; {args.runs} runs of "
          f"{args.run_length} one-row steps, each after a step of {1 + args.k} rows (median ms)")
    print(f"  the {1 + args.k}-row step: {statistics.median(draft) * 1e3:.3f} ms")
    for age, label in ((1, "1st one-row step after it"), (2, "2nd"), (3, "3rd and later (steady)")):
        m = statistics.median(by_age[age])
        print(f"  {label:26s} {m * 1e3:.3f} ms = {m / steady:.2f}x steady")
    extra = sum(statistics.median(by_age[a]) - steady for a in (1, 2))
    print(f"  a draft's cost to the steps after it: {extra * 1e3:+.3f} ms = {extra / steady:+.2f} plain steps")
    low.lm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
