"""RPC workers: decode tok/s of one model local vs over one and two loopback workers, with the planner's
prediction beside each (core/distributed.py, from the split and the measured link).

Three engines stay loaded (local, one worker, two workers each offering part of the model so both
get layers); rounds are interleaved so the ratios hold on a noisy shared machine. The engine's own
decode figure (Stats.decode_tok_s) is used for all three. Target on loopback: two workers >= 0.5x local.

    .venv/bin/python bench/rpc.py [MODEL] [--rounds N] [--gen N] [--threads N] [--worker-threads N]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggufdesk.core import distributed, gguf_meta, planner
from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.engine.rpc_workers import start_worker

PROMPT = "The river town woke slowly. Fishermen pulled their boats onto the gravel, and the baker"


def decode(client: EngineClient, gen: int) -> float:
    rid = client.generate(prompt=PROMPT, sampling=SamplingSettings(temperature=0, max_tokens=gen))
    stats = None
    for ev in client.stream(rid):
        if isinstance(ev, P.Stats) and ev.final:
            stats = ev
        elif isinstance(ev, P.Error):
            raise SystemExit(f"engine error: {ev.message}")
    return stats.decode_tok_s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gen", type=int, default=96)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2, help="engine threads (local decode)")
    ap.add_argument("--worker-threads", type=int, default=2)
    args = ap.parse_args()
    if not args.model:
        from ggufdesk.core.starter import starter_model_path

        args.model = str(starter_model_path())
    base = LoadSettings(n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads, flash_attn="off")
    info = gguf_meta.read_gguf(args.model)
    kv = planner.kv_bytes_per_layer(info, args.ctx)
    need = sum(distributed._layer_costs(info, kv))
    cb = planner.compute_buffer(info, n_ctx=args.ctx, n_ubatch=base.n_ubatch, flash=False)
    half = cb + distributed.WORKER_MARGIN + int(need * 0.75)  # neither of the two holds it alone
    one = start_worker(threads=args.worker_threads)
    two = [start_worker(mem=half, threads=args.worker_threads) for _ in range(2)]
    setups = {"local": base, "1 worker": dataclasses.replace(base, rpc=[one.endpoint]),
              "2 workers": dataclasses.replace(base, rpc=[w.endpoint for w in two])}
    clients: dict[str, EngineClient] = {}
    try:
        preds, splits = {}, {}
        for name, s in setups.items():
            c = clients[name] = EngineClient(auto_restart=False)
            c.start()
            loaded = c.load(args.model, settings=s)
            if loaded.rpc:
                preds[name] = loaded.rpc["pred_decode_tok_s"]
                preds.setdefault("local", loaded.rpc["pred_local_tok_s"])
                splits[name] = ", ".join(f"{d['endpoint']}: {d['n_layers']} layers" for d in loaded.rpc["devices"])
                splits[name] += f", local CPU: {loaded.rpc['cpu_layers']} layers"
                net = loaded.rpc["network_ms_per_token"]
                splits[name] += f"; network {net:.2f} ms/token predicted"
            decode(c, 8)  # warm-up
        got: dict[str, list[float]] = {k: [] for k in setups}
        for _ in range(args.rounds):
            for name, c in clients.items():
                got[name].append(decode(c, args.gen))
        med = {k: statistics.median(v) for k, v in got.items()}
        print(f"model {Path(args.model).name}, {args.gen} tokens, {args.rounds} interleaved rounds, medians; "
              f"engine threads {args.threads}, worker threads {args.worker_threads}")
        print(f"{'setup':<10} {'decode tok/s':>13} {'x local':>8} {'predicted':>10} {'pred/meas':>10}")
        for name in setups:
            p = preds.get(name)
            print(f"{name:<10} {med[name]:>13.1f} {med[name] / med['local']:>8.2f} "
                  f"{(f'{p:.1f}' if p else '-'):>10} {(f'{p / med[name]:.2f}' if p else '-'):>10}")
        for name, s in splits.items():
            print(f"  {name}: {s}")
        return 0
    finally:
        for c in clients.values():
            c.shutdown()
        for w in [one, *two]:
            w.stop()


if __name__ == "__main__":
    sys.exit(main())
