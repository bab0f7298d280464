"""Is bench/batch.py part 6's "without lookup" what a user without lookup gets?

Part 6 sends its plain requests (speculation off) to the engine it loaded with lookup, so both columns
come from one engine. A user who never turns lookup on runs an engine loaded without it, which skips
the verification-cost measurement at load and the lookup vocabulary readers. This bench loads both
engines side by side and sends each part 6's plain work in turn (the order alternating by round):
4 clients, 3 prompts each, aggregate tok/s while all four run (bench/batch.py `four_clients_loop`).
Printed: every round, and the medians' ratio loaded-with-lookup / loaded-without (1.0: the baseline
is the same).

    .venv/bin/python bench/batch_baseline.py [MODEL] [--rounds 8] [--work tuned|heldout|heldout2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import SERVE_SPECULATION, WORK, four_clients_loop, serve_settings
from ggufdesk.engine.link.client import EngineClient


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="tuned", choices=list(WORK))
    args = ap.parse_args()
    if args.model is None:
        from ggufdesk.core.starter import starter_model_path

        args.model = str(starter_model_path())
    print(f"model {Path(args.model).name}; work {args.work}; {args.rounds} rounds; "
          f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    th = args.threads
    settings = serve_settings(n_batch=512, n_ubatch=512, n_threads=th, n_threads_batch=th, flash_attn="auto")
    engines = {"loaded with lookup": EngineClient(auto_restart=False),
               "loaded without": EngineClient(auto_restart=False)}
    for name, client in engines.items():  # (as bench/batch.py loads its serving engine, or without lookup)
        client.start()
        client.load(args.model, settings=settings,
                    speculation=SERVE_SPECULATION if name == "loaded with lookup" else None)
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(engines)[::-1]
            for name in order:
                for kind, work in zip(("copy", "free"), WORK[args.work], strict=True):
                    v = four_clients_loop(engines[name], r, work, 128, False)
                    rates.setdefault((name, kind), []).append(v)
                    print(f"  round {r + 1}: {name}, {kind}: {v:.1f} tok/s "
                          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for client in engines.values():
            client.shutdown()
    print("\n| work | loaded with lookup | loaded without | ratio |")
    print("|---|---:|---:|---:|")
    for kind in ("copy", "free"):
        a = statistics.median(rates[("loaded with lookup", kind)])
        b = statistics.median(rates[("loaded without", kind)])
        print(f"| {kind} (plain requests) | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
