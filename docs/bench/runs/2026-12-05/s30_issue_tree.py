"""Session 30: the tree issue 29 was filed against (1af3ebd) beside HEAD, on the same host (a diagnostic).

    git worktree add /tmp/old 1af3ebd
    # the tuned suite with each tree's own bench (1af3ebd's prints its table only with a fixed K, so
    # its per-round lines are read here), from each tree's root:
    (cd /tmp/old && PYTHONPATH=/tmp/old/app $REPO/.venv/bin/python bench/speculative.py --categories \
        rag,copy,code --rounds 3 --max-tokens 96 --fixed "" --no-reference > old_1.txt)
    .venv/bin/python s30_issue_tree.py parse old_1.txt new_1.txt ...
    # one-shot `ggufdesk run [--lookup] --json` of held-out prompts through each tree's CLI, alternated:
    .venv/bin/python s30_issue_tree.py oneshot starter|smollm2 ROUNDS CATEGORIES /tmp/old [--greedy]

A category's figure is the geometric mean over its prompts of the median over rounds of adaptive / plain
tok/s (one-shot: the run's decode tok/s). Each tree keeps its own cost tables and prompt cache
(XDG_CACHE_HOME, GGUFDESK_PROMPT_CACHE under /tmp/s30). SmolLM2 is sent its prompts with `--chat` (its
template applied by the CLI); the starter gets them raw. Sampled prompts run at their temperature, seed 7
(`--greedy`: only the greedy prompts of the categories).
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))


def geo(xs: list[float]) -> float:
    return math.exp(statistics.fmean(map(math.log, xs)))


def parse(files: list[str]) -> None:
    for f in files:
        per: dict[tuple[str, str], list[float]] = {}
        for line in Path(f).read_text().splitlines():
            m = re.match(r"round \d+/\d+ (\S+)/(\S+): plain ([\d.]+), adaptive ([\d.]+)", line)
            if m:
                per.setdefault((m[1], m[2]), []).append(float(m[4]) / float(m[3]))
        cats: dict[str, list[float]] = {}
        for (c, _), rs in per.items():
            cats.setdefault(c, []).append(statistics.median(rs))
        print(Path(f).name, " ".join(f"{c} {geo(v):.2f}" for c, v in cats.items()), "| per prompt",
              " ".join(f"{p}:{statistics.median(rs):.2f}" for (_, p), rs in per.items()))


def oneshot(model: str, rounds: int, cats: set[str], old: str, greedy: bool) -> None:
    from bench.spec_heldout import SUITES, model_path

    chat = model == "smollm2"
    path = str(model_path(model))
    ws = [w for w in SUITES["heldout"] if w.category in cats and not (greedy and w.temperature)]
    trees = {"old": old, "new": str(ROOT)}

    def run(tree: str, w, lookup: bool) -> tuple[float, int, int]:  # type: ignore[no-untyped-def]
        env = dict(os.environ, PYTHONPATH=f"{trees[tree]}/app", XDG_CACHE_HOME=f"/tmp/s30/xdg_{tree}",
                   GGUFDESK_PROMPT_CACHE=f"/tmp/s30/pc_{tree}")
        cmd = [sys.executable, "-m", "ggufdesk", "run", path, "--prompt", w.prompt, "--temperature",
               str(w.temperature), "--seed", "7", "--max-tokens", "128", "--json"]
        cmd += (["--chat"] if chat else []) + (["--lookup"] if lookup else [])
        out = subprocess.run(cmd, env=env, cwd=trees[tree], capture_output=True, text=True, timeout=300, check=True)
        d = json.loads(out.stdout)
        return d["decode_tok_s"], d.get("drafted", 0), d.get("accepted", 0)

    for t in trees:  # each tree measures its cost table once, before the rounds
        run(t, ws[0], True)
    res: dict[tuple[str, str, bool], list[tuple[float, int, int]]] = {}
    for r in range(rounds):
        for w in ws:
            order = [("old", False), ("old", True), ("new", False), ("new", True)]
            for tree, lk in (reversed(order) if r % 2 else order):
                v = run(tree, w, lk)
                res.setdefault((f"{w.category}/{w.name}", tree, lk), []).append(v)
                print(r, w.category, w.name, tree, "lookup" if lk else "plain", v, flush=True)
    print(f"\n{model}: one-shot decode tok/s, lookup x plain, medians of {rounds} rounds (accepted/drafted: the last)")
    g: dict[str, list[float]] = {"old": [], "new": []}
    for w in ws:
        key, row = f"{w.category}/{w.name}", []
        for tree in trees:
            p = statistics.median(x[0] for x in res[(key, tree, False)])
            lk = statistics.median(x[0] for x in res[(key, tree, True)])
            d = res[(key, tree, True)][-1]
            g[tree].append(lk / p)
            row.append(f"{tree} {lk / p:.2f} (plain {p:.1f}, {d[2]}/{d[1]})")
        print(f"{key:24s} " + "  ".join(row))
    print("geometric mean: " + "  ".join(f"{t} {geo(v):.3f}" for t, v in g.items()))


if __name__ == "__main__":
    if sys.argv[1] == "parse":
        parse(sys.argv[2:])
    else:
        oneshot(sys.argv[2], int(sys.argv[3]), set(sys.argv[4].split(",")), sys.argv[5], "--greedy" in sys.argv)
