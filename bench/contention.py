"""Decode speed beside busy neighbours: adaptive threads (engine/batching/threads.py) vs fixed 1 and fixed 2.

llama.cpp's threads spin-wait for each other, so when another program takes a core a decode with
threads = cores collapses (issue 29: the starter, 2 threads 16.8 tok/s vs 1 thread 24.9 beside one
busy loop). Three engines stay loaded side by side with the starter: threads left to the engine
(adaptive), fixed 1 and fixed 2 (`n_threads` and `n_threads_batch`). In every round, for each
condition (0, 1 and 2 busy loops, `python -c 'while 1: pass'` subprocesses started beside them), each
engine answers the same greedy prompt in turn (the order of conditions and engines rotates from round
to round). The adaptive engine carries what it learnt from one request to the next, as it does in
use, so its figures include the time it takes to notice a change. Printed: median decode tok/s per
condition and engine, and adaptive / the better fixed choice (target >= 0.9 in every condition).

With `--lookup` every engine answers a code edit from the tuned suite (bench/spec_workloads.py) with
adaptive prompt lookup: its verification steps carry up to 16 rows, so the batch tuner judges steps
of many sizes (`threads.units`), where the free-writing prompt gives it almost only one-row steps.

`--gap S` waits S seconds between answers. Without it each answer starts as the engine before it
stops, so the CPU-load sensor's last reading (a quarter second) still sees that engine's threads and
the adaptive engine starts on fewer threads until the next one: a neighbour that stops just before a
request, which costs a short answer with lookup (under a second) a larger share than a plain one.

    .venv/bin/python bench/contention.py [--rounds 5] [--tokens 128] [--loops 0,1,2] [--model PATH] [--lookup]
        [--gap S]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_workloads import WORKLOADS
from ggufdesk.core.starter import starter_model_path
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"
ENGINES = {"adaptive": 0, "fixed 1": 1, "fixed 2": 2}  # n_threads (0: the engine chooses and adapts)


EDIT = next(w.prompt for w in WORKLOADS if (w.category, w.name) == ("code", "stack"))
LOOKUP = {"mode": "lookup", "k_max": 16, "adaptive": True, "lookup_history": False}


def decode(client: EngineClient, tokens: int, lookup: bool = False) -> tuple[float, int]:
    """(decode tok/s, the threads the engine reported last) of one greedy answer."""
    rid = client.generate(prompt=EDIT if lookup else PROMPT,
                          sampling={"temperature": 0.0, "max_tokens": tokens, "stop": ["never-stop-here"]},
                          speculation=LOOKUP if lookup else {"mode": "off"})
    stats = None
    for ev in client.stream(rid, timeout=600):
        if isinstance(ev, P.Stats):
            stats = ev
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error: {ev.message}")
    assert stats is not None
    return stats.decode_tok_s, stats.threads


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--loops", default="0,1,2", help="busy loops beside the engine, per condition")
    ap.add_argument("--model", help="a GGUF (default: the starter)")
    ap.add_argument("--lookup", action="store_true", help="a code edit with adaptive prompt lookup")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between answers (default 0)")
    args = ap.parse_args()
    model = args.model or str(starter_model_path())
    # the engines' own cache (recorded decode speeds, saved prompts) in a throwaway folder: runs made
    # beside busy loops on purpose must not become this machine's calibration (hardware.record_decode_run)
    cache = tempfile.mkdtemp(prefix="ggufdesk-contention-")  # (removed at the end)
    os.environ["XDG_CACHE_HOME"] = cache
    loops = [int(x) for x in args.loops.split(",")]
    clients = {name: EngineClient(auto_restart=False) for name in ENGINES}
    speed: dict[tuple[int, str], list[float]] = {}
    threads: dict[tuple[int, str], list[int]] = {}
    try:
        for name, n in ENGINES.items():
            clients[name].__enter__()
            # with --lookup, loaded with it: the verification costs are measured at load, while the
            # machine is quiet (later, idle, the other engines' turns keep it busy)
            clients[name].load(model, settings={"n_ctx": 2048, "n_threads": n, "n_threads_batch": n},
                               speculation=LOOKUP if args.lookup else None)
            decode(clients[name], 8, args.lookup)  # warm-up: page the weights in
        for rnd in range(args.rounds):
            for cond in loops[rnd % len(loops):] + loops[:rnd % len(loops)]:
                procs = busy_loops(cond)
                try:
                    names = list(ENGINES)
                    for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                        time.sleep(args.gap)
                        tok_s, n = decode(clients[name], args.tokens, args.lookup)
                        speed.setdefault((cond, name), []).append(tok_s)
                        threads.setdefault((cond, name), []).append(n)
                finally:
                    stop(procs)
                print(f"round {rnd + 1}/{args.rounds}, {cond} busy loops: " + ", ".join(
                    f"{name} {speed[cond, name][-1]:.1f}" for name in ENGINES), file=sys.stderr, flush=True)
    finally:
        for c in clients.values():
            c.__exit__(None, None, None)
        shutil.rmtree(cache, ignore_errors=True)
    print(f"\ndecode tok/s, medians of {args.rounds} interleaved rounds, {args.tokens} tokens, "
          f"{os.cpu_count()} cores" + (", a code edit with adaptive lookup" if args.lookup else "")
          + (f", {args.gap:g} s between answers" if args.gap else ""))
    print("| busy loops | adaptive (threads at the end) | fixed 1 | fixed 2 | adaptive / better fixed |")
    print("|---:|---:|---:|---:|---:|")
    for cond in loops:
        med = {name: statistics.median(speed[cond, name]) for name in ENGINES}
        better = max(med["fixed 1"], med["fixed 2"])
        n_end = statistics.median(threads[cond, "adaptive"])
        print(f"| {cond} | {med['adaptive']:.1f} ({n_end:g}) | {med['fixed 1']:.1f} | {med['fixed 2']:.1f} | "
              f"{med['adaptive'] / better:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
