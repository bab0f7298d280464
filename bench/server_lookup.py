"""Prompt lookup against llama.cpp's own: ggufdesk serve --lookup beside llama-server's n-gram speculation.

llama-server (the vendored llama.cpp of our llama-cpp-python, built once by bench/server.py) drafts from
the token history without a draft model too (`--spec-type`, docs/speculative.md of llama.cpp):
`--spec-default` turns on its recommended one (`ngram-mod`: a rolling hash of the last 24 tokens, shared by
all slots, drafting 48-64 tokens), and its docs show `ngram-simple` (the last 12-gram's earlier match, 48
tokens after it) with `--spec-draft-n-max 64` for rewriting code. Each is measured against its own
server without speculation, on the same prompts, threads, batch sizes, flash attention and KV cache:

- 4 clients, each sending three prompts of bench/batch.py's part-6 work one after another (its copy/edit
  prompts, greedy, and its free writing, sampled), non-streaming /v1/completions of up to 128 tokens:
  all answers' tokens over the time from the first request to the last answer;
- 1 client: the same twelve prompts one at a time: their tokens over the sum of their times.

Configurations are interleaved, their order rotating by round; every run is printed, then medians and
each one's ratio to its own server without speculation. Greedy answers are compared with that server's
plain ones (speculation is lossless: they must be the same text). Drafted and accepted tokens come from
each server's own account (ggufdesk's /metrics, llama-server's `timings`).

    .venv/bin/python bench/server_lookup.py [MODEL] [--rounds 3] [--work tuned|heldout|heldout2] [--clients 1,4]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import WORK, parse_work_arguments, work_arguments
from bench.server import Server, ggufdesk_cmd, llama_server_cmd, running, with_ports

TOKENS = 128
PER_CLIENT = 3
CTX, SLOTS = 12288, 4


def configs(model: str, threads: int) -> list[Server]:
    # (every request names its temperature, so ours' default of 0 there changes nothing)
    ours = ggufdesk_cmd(model, threads, CTX, SLOTS)
    theirs = llama_server_cmd(model, threads, CTX, SLOTS)
    servers = [Server("ggufdesk", ours, 0, "/health"), Server("ggufdesk --lookup", [*ours, "--lookup"], 0, "/health"),
               Server("llama-server", theirs, 0, "/health"),
               Server("llama-server --spec-default", [*theirs, "--spec-default"], 0, "/health"),
               Server("llama-server ngram-simple", [*theirs, "--spec-type", "ngram-simple", "--spec-draft-n-max", "64"],
                      0, "/health")]
    return with_ports(servers)


def base_of(name: str) -> str:
    return name.split(" ")[0]


def ours_drafts(srv: Server) -> tuple[float, float]:
    """ggufdesk's drafted and accepted tokens since it started (/metrics)."""
    text = httpx.get(srv.url + "/metrics", timeout=10).text

    def total(metric: str) -> float:
        m = re.search(rf"^{metric}_total (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    return total("ggufdesk_speculative_drafted_tokens"), total("ggufdesk_speculative_accepted_tokens")


def complete(c: httpx.Client, srv: Server, w, seed: int) -> dict:
    body = {"model": srv.model, "prompt": w.prompt, "max_tokens": TOKENS, "temperature": w.temperature,
            "seed": seed, "stop": ["never-stop-here"]}
    t = time.perf_counter()
    r = c.post(srv.url + "/v1/completions", json=body)
    r.raise_for_status()
    data = r.json()
    timings = data.get("timings") or {}
    return {"s": time.perf_counter() - t, "n": int(data["usage"]["completion_tokens"]),
            "text": data["choices"][0]["text"], "drafted": timings.get("draft_n", 0),
            "accepted": timings.get("draft_n_accepted", 0), "greedy": w.temperature == 0,
            "key": f"{w.category}/{w.name}"}  # (greedy answers do not depend on the seed)


def run(srv: Server, work: list, r: int, clients: int) -> tuple[float, list[dict]]:
    """One round's twelve requests with `clients` at once: (tok/s, the answers)."""
    jobs = [[(work[(r + i + 4 * j) % len(work)], 1 + i + 4 * j) for j in range(PER_CLIENT)] for i in range(4)]
    out: list[dict] = []
    lock = threading.Lock()
    with httpx.Client(timeout=600) as c:
        if clients == 1:
            for job in jobs:
                for w, seed in job:
                    out.append(complete(c, srv, w, seed))
            return sum(a["n"] for a in out) / sum(a["s"] for a in out), out

        def client(job: list) -> None:
            for w, seed in job:
                a = complete(c, srv, w, seed)
                with lock:
                    out.append(a)

        t = time.perf_counter()
        threads = [threading.Thread(target=client, args=(job,)) for job in jobs]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t
    if len(out) != 4 * PER_CLIENT:
        raise SystemExit(f"{srv.name}: {4 * PER_CLIENT - len(out)} requests failed")
    return sum(a["n"] for a in out) / wall, out


def main() -> int:
    ap = work_arguments(__doc__)
    ap.add_argument("--clients", default="1,4", help="comma-separated: 1 and/or 4")
    args = parse_work_arguments(ap)
    modes = [int(x) for x in args.clients.split(",")]
    if not modes or any(m not in (1, 4) for m in modes):
        ap.error("--clients takes 1, 4 or 1,4")
    copy_work, free_work = WORK[args.work]
    servers = configs(args.model, args.threads)  # (builds llama-server first if it is not cached yet)
    with running(servers, "server-lookup"):
        print(f"model {Path(args.model).name}; work {args.work}; threads {args.threads}; {args.rounds} rounds; "
              f"load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
        return measure(servers, args, modes, copy_work, free_work)


def measure(servers: list[Server], args: argparse.Namespace, modes: list[int], copy_work: list,
            free_work: list) -> int:
    rates: dict[tuple[str, str, int], list[float]] = {}
    drafts: dict[tuple[str, str], list[float]] = {}
    texts: dict[tuple[str, str, int], dict[str, list[str]]] = {}
    for r in range(args.rounds):
        order = servers[r % len(servers):] + servers[:r % len(servers)]
        for srv in order:
            for kind, work in (("copy", copy_work), ("free", free_work)):
                for clients in modes:
                    before = ours_drafts(srv) if srv.name.startswith("ggufdesk") else (0.0, 0.0)
                    rate, answers = run(srv, work, r, clients)
                    if srv.name.startswith("ggufdesk"):
                        after = ours_drafts(srv)
                        d, a = after[0] - before[0], after[1] - before[1]
                    else:
                        d, a = sum(x["drafted"] for x in answers), sum(x["accepted"] for x in answers)
                    tally = drafts.setdefault((srv.name, kind), [0.0, 0.0, 0.0])
                    tally[0] += sum(x["n"] for x in answers)
                    tally[1] += d
                    tally[2] += a
                    rates.setdefault((srv.name, kind, clients), []).append(rate)
                    for x in answers:
                        if x["greedy"]:
                            texts.setdefault((srv.name, kind, clients), {}).setdefault(x["key"], []).append(x["text"])
                    print(f"round {r + 1} {srv.name:28s} {kind} {clients} client(s): {rate:6.1f} tok/s "
                          f"(drafted {d:.0f}, accepted {a:.0f}; load {os.getloadavg()[0]:.1f})", flush=True)
    report(servers, modes, rates, drafts, texts)
    return 0


def report(servers: list[Server], modes: list[int], rates: dict, drafts: dict, texts: dict) -> None:
    print("\nmedian tok/s over rounds, and the ratio to the same server without speculation")
    print("| server | " + " | ".join(f"{k}, {c} client{'s' if c > 1 else ''}" for k in ("copy", "free") for c in modes)
          + " | accepted / drafted (copy, free) | accepted / answer tokens (copy, free) |")
    print("|---|" + "---:|" * (2 * len(modes) + 2))
    for srv in servers:
        cells = []
        for kind in ("copy", "free"):
            for c in modes:
                v = statistics.median(rates[(srv.name, kind, c)])
                ref = statistics.median(rates[(base_of(srv.name), kind, c)])
                cells.append(f"{v:.1f} ({v / ref:.2f}x)" if srv.name != base_of(srv.name) else f"{v:.1f}")
        acc = []
        per = []
        for kind in ("copy", "free"):
            n, d, a = drafts[(srv.name, kind)]
            acc.append(f"{a / d:.2f}" if d else "-")
            per.append(f"{a / n:.2f}" if n else "-")
        print(f"| {srv.name} | " + " | ".join(cells) + f" | {', '.join(acc)} | {', '.join(per)} |")
    print("\ngreedy answers unlike the same server's first answer to that prompt without speculation (with several\n"
          "clients a row's logits depend on what else the step carries, so near ties can tip: the servers\n"
          "without speculation are compared with their own first round as the measure of that)")
    for (name, kind, c), got in texts.items():
        ref = texts.get((base_of(name), kind, c), {})
        own = name == base_of(name)
        pairs = [(t, ref[key][0]) for key, ts in got.items() if key in ref for t in (ts[1:] if own else ts)]
        diff = sum(1 for t, first in pairs if t != first)
        print(f"  {name}, {kind}, {c} client(s): {diff} of {len(pairs)}")


if __name__ == "__main__":
    sys.exit(main())
