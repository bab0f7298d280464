"""The thread tuner while prompts are read beside decoding sequences: how many prompt steps run below the
count the CPU-load sensor allows, and what the batch tuner tried (engine/batching/threads.py).

Four requests in flight, in-process (tests/engine/live.py, the worker's `BatchEngine`), threads left to
the tuner (the settings' count 0); whenever one ends, the next starts with a prompt of its own of about
`--words` words, so prompt chunks ride beside the others' decode rows all along, as on a busy server.
Every step is timed by the engine as usual; this counts the steps that carried prompt rows, those of
them run at fewer batch threads than the sensor's ceiling (on a quiet machine: fewer than the cores),
and every try of the batch tuner with the windows it compared. Not a speed bench: the wall time is
printed for reference only.

    .venv/bin/python bench/prefill_threads.py [starter|smollm2|PATH] [--requests 24] [--words 900] [--tokens 96]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import serve_settings, text
from bench.spec_heldout import model_path
from ggufdesk.engine.batching.sequence import SequenceStatus
from tests.engine.live import Live

LIVE = (SequenceStatus.WAITING, SequenceStatus.PREFILLING, SequenceStatus.DECODING, SequenceStatus.VERIFYING)
READING = (SequenceStatus.WAITING, SequenceStatus.PREFILLING)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2", help="starter, smollm2 (the default) or a path")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--words", type=int, default=900)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    args.model = model_path(args.model)
    live = Live(args.model, serve_settings())
    th = live.engine.threads
    tries: list[str] = []
    real_try, real_judge = th.batch._try, th.batch._judge

    def try_(n: int, med: float) -> None:
        tries.append(f"{th.batch.n}->{n} (window {1000 * med:.1f} ms a unit)")
        real_try(n, med)

    def judge(med: float) -> None:
        trial = th.batch.n
        real_judge(med)
        tries[-1] += f", the trial's {1000 * med:.1f}: {'kept' if th.batch.n == trial else 'back'}"

    th.batch._try, th.batch._judge = try_, judge  # type: ignore[method-assign]
    seqs: list[Any] = []
    started = 0

    def start() -> None:
        nonlocal started
        s = live.sequence(live.tokens(text(args.words, f"p{started}")), args.tokens, temperature=0.7, seed=started)
        live.engine.submit(s)
        seqs.append(s)
        started += 1

    for _ in range(min(4, args.requests)):
        start()
    prompt_steps = below = steps = 0
    t0 = time.perf_counter()
    while live.engine.busy:
        reading = any(s.status in READING for s in seqs)
        live.engine.step()
        steps += 1
        if reading:
            prompt_steps += 1
            below += th.batch.n < th.batch.ceiling
        for s in [s for s in seqs if s.status not in LIVE]:
            seqs.remove(s)
            if started < args.requests:
                start()
    print(f"{Path(args.model).name}: {args.requests} requests of ~{args.words} words, {args.tokens} tokens each; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"  {steps} steps in {time.perf_counter() - t0:.1f} s; {prompt_steps} carried prompt rows, "
          f"{below} of them at fewer batch threads than the sensor allowed")
    print(f"  batch tuner tries: {'; '.join(tries) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
