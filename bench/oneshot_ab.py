"""Time to first token of a fresh `ggufdesk run --chat` from two source trees, alternating: what a change to
what runs before the first token saves.

    python bench/oneshot_ab.py BEFORE/app AFTER/app [--model smollm2-135m-instruct] [--rounds 10]

`git worktree add /tmp/before COMMIT` gives the other tree. Each run is its own process (PYTHONPATH picks
the tree; the engine process inherits it), greedy, 8 tokens, the engine's `ttft_s` (request to first
token, the model already loaded); one warm-up run per tree is not counted; the order alternates per round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def one(app: str, model: str) -> float:
    cmd = [sys.executable, "-m", "ggufdesk", "run", model, "--chat", "--prompt", PROMPT, "--max-tokens", "8",
           "--temperature", "0", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/",
                         env=dict(os.environ, PYTHONPATH=app))
    return float(json.loads(out.stdout)["ttft_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="the app/ folder of the tree before the change")
    ap.add_argument("after", help="the app/ folder of the tree after it")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a library id or a .gguf path")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    trees = {"before": a.before, "after": a.after}
    for app in trees.values():
        one(app, a.model)  # warm-up: the OS's file cache
    res: dict[str, list[float]] = {k: [] for k in trees}
    for r in range(a.rounds):
        for k in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            res[k].append(one(trees[k], a.model))
        print(f"round {r + 1}: " + "  ".join(f"{k} {res[k][-1] * 1e3:.0f} ms" for k in trees),
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    for k in trees:
        print(f"{k}: median {statistics.median(res[k]) * 1e3:.0f} ms of {a.rounds}: "
              + ", ".join(f"{x * 1e3:.0f}" for x in res[k]))
    print(f"after / before: {statistics.median(res['after']) / statistics.median(res['before']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
