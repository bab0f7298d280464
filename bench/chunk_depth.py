"""Chunked prefill deep in a context: a streamed answer beside an agent's long prompt and its later turns.

A client streams an answer (stream A, short prompt) while an agent's long prompt is read beside it (turn
1), then the agent's next turns arrive: 20 new tokens right away (turn 2), and 100 new tokens right after a
short chat prompt C was read beside A (turn 3: the last chunks priced were shallow ones). Every step is
timed in-process on the engine's own step loop (tests/engine/live.py). Printed per turn: the agent's time
to its first token, and A's gaps while it waits: the worst step and the 90th percentile, in A's plain steps
(engine/batching/chunking.py aims at 9). Two trees alternate round by round:

    .venv/bin/python bench/chunk_depth.py BEFORE/app AFTER/app [--model GGUF] [--words 3000] [--rounds 2]

(default model: SmolLM2-135M-Instruct, every layer attending globally; `--words 3000` is ~3,200 tokens).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TURNS = ("turn 1", "turn 2", "shallow C", "turn 3")


def child(app: str, model: str, words: int) -> None:
    sys.path[:0] = [str(HERE), app]
    from bench.batch import text
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.batching.sequence import SequenceStatus
    from tests.engine.live import Live

    import ggufdesk
    assert ggufdesk.__file__.startswith(app), f"{ggufdesk.__file__} is not under {app}"
    live = Live(model, LoadSettings(n_ctx=16384, n_parallel=4, n_threads=2, n_threads_batch=2))
    steps: list[float] = []

    def step() -> None:
        t = time.perf_counter()
        live.engine.step()
        steps.append(time.perf_counter() - t)

    a = live.sequence(text(20, "stream"), 9000, stop=("never-stop-here",))
    live.engine.submit(a)
    for _ in range(30):
        step()
    steps.clear()
    for _ in range(21):
        step()
    plain = statistics.median(steps)
    reading = (SequenceStatus.WAITING, SequenceStatus.PREFILLING)
    out: dict[str, dict[str, float]] = {}

    def turn(name: str, prompt: list[int], n: int) -> list[int]:
        seq = live.sequence(prompt, n, stop=("never-stop-here",))
        steps.clear()
        t = time.perf_counter()
        live.engine.submit(seq)
        while seq.status in reading:
            step()
        ttft = time.perf_counter() - t
        gaps = sorted(s / plain for s in steps)
        out[name] = {"ttft": ttft, "worst": gaps[-1], "p90": gaps[int(0.9 * (len(gaps) - 1))], "steps": len(gaps),
                     "tokens": len(prompt)}
        while seq.status in (SequenceStatus.DECODING, SequenceStatus.VERIFYING):
            live.engine.step()
        return live.result(seq.rid).tokens

    p = live.tokens(text(words, "doc"))
    p += turn("turn 1", p, 4)
    p += live.tokens(" Now tell me more about the second part of that, and be brief please.")
    p += turn("turn 2", p, 4)
    turn("shallow C", live.tokens(text(300, "chat")), 2)
    p += live.tokens(" ok and then? " * 20)
    turn("turn 3", p, 4)
    live.cancels.add(a.rid)
    live.engine.step()
    print(json.dumps({"plain_ms": 1000 * plain, "turns": out}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="*", help="app folders to compare (default: this tree's)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--words", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = args.model
    if model is None:
        from ggufdesk.core import starter

        model = str(starter.model_path(starter.SMOLLM2))
    if args.child:
        child(args.child, model, args.words)
        return 0
    trees = args.trees or [str(HERE / "app")]
    print(f"model {Path(model).name}; {args.words} words; {args.rounds} rounds; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for t in trees if r % 2 == 0 else trees[::-1]:
            cmd = [sys.executable, __file__, "--child", t, "--model", model, "--words", str(args.words)]
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": t})
            if res.returncode:
                print(res.stderr[-2000:])
                return 1
            got = json.loads(res.stdout.strip().splitlines()[-1])
            runs[t].append(got)
            print(f"  round {r + 1} {t}: A's plain step {got['plain_ms']:.1f} ms; " + "; ".join(
                f"{n} ({v['tokens']:.0f} tokens): TTFT {v['ttft']:.2f} s, worst {v['worst']:.0f}x, p90 {v['p90']:.0f}x "
                f"in {v['steps']:.0f} steps" for n, v in got["turns"].items()), flush=True)
    print("\n| tree | turn | TTFT (median) | A's worst gap | A's p90 gap | steps |")
    print("|---|---|---:|---:|---:|---:|")
    for t in trees:
        for n in TURNS:
            vals = [g["turns"][n] for g in runs[t]]

            def med(k: str, vals: list[dict] = vals) -> float:
                return statistics.median(v[k] for v in vals)
            print(f"| {t} | {n} | {med('ttft'):.2f} s | {med('worst'):.0f}x | {med('p90'):.0f}x | {med('steps'):.0f} |")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
