"""Requests sent at the same moment: how soon each answer ends, streamed and not.

Four clients each send one prompt at once (bench/batch.py's part-6 work, rotating by round, each prompt
with a fresh tag so that no cache holds it) as greedy /v1/completions of 64 tokens: once streamed (the
time to each request's first text chunk and to its end) and once not (`stream: false`: the answer comes
whole). The engine reads waiting prompts a chunk a step beside answers somebody streams, so their next
token is never far away, and a whole batch a step beside answers nobody reads until they end
(engine/batching/scheduler.py); this bench shows what each costs and saves against llama-server, which
reads every waiting prompt before anyone decodes.

Servers (bench/server_lookup.py's, the same threads, batch sizes, flash attention and unified KV cache):
`ggufdesk serve` of this tree; with `--before TREE` (repeatable) the same command on another checkout
(its app/ on PYTHONPATH), named by its commit; llama-server. Interleaved, order rotating by round.
Printed per run: makespan (first request sent to last answer), each request's end (sorted) and, streamed,
each time to first token; then medians and each server's makespan ratio to llama-server's in the
same round and mode.

    .venv/bin/python bench/burst.py [MODEL] [--rounds 3] [--work tuned|heldout|heldout2] [--before TREE ...]
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import WORK, parse_work_arguments, work_arguments
from bench.prompt_memory import CTX, SLOTS, configs
from bench.server import Server, running

TOKENS = 64
CLIENTS = 4
MODES = ("stream", "whole")


def request(c: httpx.Client, srv: Server, prompt: str, stream: bool, t0: float) -> dict:
    """One completion: its end and (streamed) first text chunk, in seconds from t0; its tokens."""
    body = {"model": srv.model, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0.0, "seed": 1,
            "stop": ["never-stop-here"], "stream": stream}
    if not stream:
        r = c.post(srv.url + "/v1/completions", json=body)
        r.raise_for_status()
        return {"end": time.perf_counter() - t0, "n": int(r.json()["usage"]["completion_tokens"])}
    body["stream_options"] = {"include_usage": True}  # the token count: a text chunk may hold several, or none
    first, n, usage = None, 0, None
    with c.stream("POST", srv.url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices") or [{}]
            if choices[0].get("text"):
                n += 1
                first = first if first is not None else time.perf_counter() - t0
    n = int(usage["completion_tokens"]) if usage and "completion_tokens" in usage else n  # chunks where none
    return {"end": time.perf_counter() - t0, "first": first, "n": n}


def burst(srv: Server, prompts: list[str], mode: str) -> dict:
    """The prompts sent at once: makespan, ends and first tokens (sorted), tokens per second."""
    out: list[dict] = []
    with httpx.Client(timeout=900) as c:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=lambda p=p: out.append(request(c, srv, p, mode == "stream", t0)))
                   for p in prompts]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if len(out) != len(prompts):
        raise SystemExit(f"{srv.name}: some requests failed")
    makespan = max(o["end"] for o in out)
    return {"makespan": makespan, "ends": sorted(o["end"] for o in out), "tps": sum(o["n"] for o in out) / makespan,
            "firsts": sorted(o["first"] for o in out if o.get("first") is not None)}


def main() -> int:
    ap = work_arguments(__doc__)
    ap.add_argument("--before", action="append", default=[],
                    help="another checkout whose `ggufdesk serve` runs beside this tree's (may be repeated)")
    args = parse_work_arguments(ap)
    copy_work, free_work = WORK[args.work]
    work = [*copy_work, *free_work]
    servers = configs(args.model, args.threads, args.before, False)
    runs: dict[tuple[str, str], list[dict]] = {}
    with running(servers, "burst"):
        print(f"model {Path(args.model).name}; work {args.work} ({len(work)} prompts, {CLIENTS} at once); threads "
              f"{args.threads}; ctx {CTX}, {SLOTS} slots; {args.rounds} rounds; load average at start "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
        for r in range(args.rounds):
            chosen = [work[(CLIENTS * r + i) % len(work)].prompt for i in range(CLIENTS)]
            for srv in servers[r % len(servers):] + servers[:r % len(servers)]:
                for mode in MODES if r % 2 == 0 else MODES[::-1]:
                    tag = f"[{r}-{uuid.uuid4().hex[:8]}] "
                    m = burst(srv, [tag + p for p in chosen], mode)
                    runs.setdefault((srv.name, mode), []).append(m)
                    firsts = " ".join(f"{t:.2f}" for t in m["firsts"])
                    print(f"round {r + 1} {srv.name:24s} {mode:6s} makespan {m['makespan']:5.2f} s "
                          f"{m['tps']:5.1f} tok/s | ends {' '.join(f'{t:.2f}' for t in m['ends'])}"
                          + (f" | first tokens {firsts}" if firsts else ""), flush=True)
    ref = servers[-1].name  # llama-server
    print(f"\nmedians over rounds; makespan's ratio to {ref}'s in the same round and mode (lower is sooner): "
          f"median (lowest-highest), then the median ratio to {servers[0].name}'s")
    for (name, mode), ms in runs.items():
        ratios = [m["makespan"] / o["makespan"] for m, o in zip(ms, runs[(ref, mode)])]
        to_first = statistics.median(m["makespan"] / o["makespan"] for m, o in zip(ms, runs[(servers[0].name, mode)]))
        mean_end = statistics.median(statistics.fmean(m["ends"]) for m in ms)
        first = (f", first tokens {statistics.median(m['firsts'][0] for m in ms):.2f}-"
                 f"{statistics.median(m['firsts'][-1] for m in ms):.2f} s" if mode == "stream" else "")
        print(f"{name:24s} {mode:6s} makespan {statistics.median(m['makespan'] for m in ms):5.2f} s, "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}), "
              f"{to_first:.2f}x {servers[0].name}'s, mean end {mean_end:5.2f} s"
              f"{first}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
