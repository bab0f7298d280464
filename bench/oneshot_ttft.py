"""Time to first token of a one-shot `ggufdesk run` with prompt lookup on, against the same run without it.

Issue 29's target: lookup costs a one-shot run at most 5% of its time to first token (it was 1.19x on a
short free-writing prompt: the vocabulary reader, the verification-cost calibration and the prompt's
n-gram index ran before the first token). Each round runs every prompt plain and with `--lookup`, in
alternating order (plain first on even rounds), each as its own process, as a user would; the TTFT is
the engine's (`--json`'s ttft_s: from the request to its first token, the model already loaded), and
the wall time of the whole command is printed beside it. The verification-cost table is measured once
per model and machine and kept on disk, so a warm-up pair runs first and is not counted.

    python bench/oneshot_ttft.py [--model smollm2-135m-instruct] [--rounds 5] [--json out.json]

The prompts: the short free-writing prompt the issue measured on, and two it did not (held out: one in
German, one that asks for a copy).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = {
    "free (issue's)": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "German (held out)": "Schreibe einen kurzen Brief an eine Freundin über deinen letzten Urlaub am Meer.",
    "copy (held out)": ("Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, "
                        "oranges, peaches, apricots."),
}


def one(model: str, prompt: str, lookup: bool, a: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, "-m", "ggufdesk", "run", model, "--chat", "--prompt", prompt, "--max-tokens",
           str(a.tokens), "--temperature", "0", "--json", *(["--lookup"] if lookup else [])]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=str(ROOT))
    wall = time.perf_counter() - t0
    r = json.loads(out.stdout)
    return {"ttft_s": float(r["ttft_s"]), "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a library id or a .gguf path")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args()
    first = next(iter(PROMPTS.values()))
    for lookup in (False, True):  # warm-up, not counted: the OS's file cache, the cost table on disk
        one(a.model, first, lookup, a)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {n: {"plain": [], "lookup": []} for n in PROMPTS}
    for r in range(a.rounds):
        for name, prompt in PROMPTS.items():
            for lookup in ((False, True) if r % 2 == 0 else (True, False)):
                res = one(a.model, prompt, lookup, a)
                runs[name]["lookup" if lookup else "plain"].append(res)
                print(f"  round {r + 1} {name:18s} {'lookup' if lookup else 'plain ':6s} TTFT "
                      f"{res['ttft_s'] * 1000:7.1f} ms  wall {res['wall_s']:.2f} s", file=sys.stderr, flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(runs, indent=1))
    print("| prompt | plain TTFT median (ms) | lookup TTFT median (ms) | lookup / plain (median of pairs) | "
          "wall lookup / plain |")
    print("|---|---|---|---|---|")
    for name, per in runs.items():
        p, q = per["plain"], per["lookup"]
        ratio = statistics.median(b["ttft_s"] / x["ttft_s"] for x, b in zip(p, q))
        wall = statistics.median(b["wall_s"] / x["wall_s"] for x, b in zip(p, q))
        print(f"| {name} | {statistics.median(x['ttft_s'] for x in p) * 1000:.1f} | "
              f"{statistics.median(x['ttft_s'] for x in q) * 1000:.1f} | **{ratio:.2f}** | {wall:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
