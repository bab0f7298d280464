"""Conversations that outnumber the slots: recent prompts kept in RAM (engine/batching/ram_cache.py) vs not.

Four clients, each with three conversations, on a server with four sequence slots (bench/server_lookup.py's
ggufdesk and llama-server, the same threads, batch sizes, flash attention and unified KV cache). Turn 1:
each client sends its three conversations' first prompts one after another (bench/batch.py's part-6
prompts, greedy, non-streaming /v1/completions of 64 tokens, `--tokens`); turn 2: each conversation's next turn (its
prompt, the answer, a short follow-up) the same way. By turn 2 every slot has served three other prompts
since, so only a cache beyond the slots finds a conversation's start. Every prompt of a round starts with
that round's own tag, so nothing is found from an earlier round or run.

Servers: `ggufdesk serve` of this tree; with `--before TREE` (repeatable) the same command on another
checkout (its app/ on PYTHONPATH: an engine before a change), named by its commit; llama-server (its RAM
cache, `--cache-ram`, 8 GiB by default) and, with `--cache-ram-off`, llama-server `--cache-ram 0`.
Interleaved, order rotating by round; each turn's makespan (first request sent to last answer), its
tokens/s and the prompt tokens the server says came from a cache are printed per run, then medians and
each server's ratio to the first one.

    .venv/bin/python bench/prompt_memory.py [MODEL] [--rounds 3] [--work tuned|heldout|heldout2] [--tokens 64]
        [--before TREE ...]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.batch import WORK, parse_work_arguments, work_arguments
from bench.server import Server, ggufdesk_cmd, llama_server_cmd, running, with_ports

TOKENS = 64
CLIENTS, PER_CLIENT = 4, 3
CTX, SLOTS = 12288, 4
FOLLOW_UP = "\n\nThank you. Now the same once more, in fewer words:\n"


def configs(model: str, threads: int, before: list[str], cache_ram_off: bool) -> list[Server]:
    ours = ggufdesk_cmd(model, threads, CTX, SLOTS)
    theirs = llama_server_cmd(model, threads, CTX, SLOTS)
    servers = [Server("ggufdesk", ours, 0, "/health")]
    for tree in before:
        rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        servers.append(Server(f"ggufdesk {rev.stdout.strip() or tree}",
                              ["env", f"PYTHONPATH={Path(tree).resolve() / 'app'}", *ours], 0, "/health"))
    servers.append(Server("llama-server", theirs, 0, "/health"))
    if cache_ram_off:
        servers.append(Server("llama-server --cache-ram 0", [*theirs, "--cache-ram", "0"], 0, "/health"))
    return with_ports(servers)


def complete(c: httpx.Client, srv: Server, prompt: str, tokens: int) -> dict:
    body = {"model": srv.model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "seed": 1,
            "stop": ["never-stop-here"]}
    t = time.perf_counter()
    r = c.post(srv.url + "/v1/completions", json=body)
    r.raise_for_status()
    data = r.json()
    usage = data["usage"]
    cached = (data.get("timings") or {}).get("cache_n")
    if cached is None:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"s": time.perf_counter() - t, "n": int(usage["completion_tokens"]), "text": data["choices"][0]["text"],
            "prompt": int(usage["prompt_tokens"]), "cached": int(cached)}


def turn(srv: Server, prompts: list[list[str]], tokens: int) -> tuple[float, list[dict]]:
    """Each client sends its prompts one after another, all clients at once: (makespan, answers by client)."""
    out: list[list[dict]] = [[] for _ in prompts]
    with httpx.Client(timeout=900) as c:
        def client(i: int) -> None:
            for p in prompts[i]:
                out[i].append(complete(c, srv, p, tokens))

        t = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t
    if any(len(o) != len(p) for o, p in zip(out, prompts)):
        raise SystemExit(f"{srv.name}: some requests failed")
    return wall, out


def conversation(srv: Server, work: list, r: int, tokens: int) -> dict:
    tag = f"[{r}-{uuid.uuid4().hex[:8]}] "
    firsts = [[tag + work[(r + i + CLIENTS * j) % len(work)].prompt for j in range(PER_CLIENT)]
              for i in range(CLIENTS)]
    wall1, ans1 = turn(srv, firsts, tokens)
    seconds = [[p + a["text"] + FOLLOW_UP for p, a in zip(ps, ans)] for ps, ans in zip(firsts, ans1)]
    wall2, ans2 = turn(srv, seconds, tokens)
    flat1, flat2 = [a for o in ans1 for a in o], [a for o in ans2 for a in o]
    return {"wall1": wall1, "wall2": wall2, "tps1": sum(a["n"] for a in flat1) / wall1,
            "tps2": sum(a["n"] for a in flat2) / wall2, "cached2": sum(a["cached"] for a in flat2),
            "prompt2": sum(a["prompt"] for a in flat2), "req2": statistics.median(a["s"] for a in flat2)}


def main() -> int:
    ap = work_arguments(__doc__)
    ap.add_argument("--before", action="append", default=[],
                    help="another checkout whose `ggufdesk serve` runs beside this tree's (may be repeated)")
    ap.add_argument("--cache-ram-off", action="store_true", help="also llama-server --cache-ram 0")
    ap.add_argument("--tokens", type=int, default=TOKENS, help="tokens per answer (an agent's tool calls run longer)")
    args = parse_work_arguments(ap)
    copy_work, free_work = WORK[args.work]
    work = [*copy_work, *free_work][:CLIENTS * PER_CLIENT]
    servers = configs(args.model, args.threads, args.before, args.cache_ram_off)
    runs: dict[str, list[dict]] = {}
    with running(servers, "prompt-memory"):
        print(f"model {Path(args.model).name}; work {args.work} ({len(work)} prompts); {args.tokens} tokens an answer; "
              f"threads {args.threads}; "
              f"{args.rounds} rounds; load average at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
              flush=True)
        for r in range(args.rounds):
            for srv in servers[r % len(servers):] + servers[:r % len(servers)]:
                m = conversation(srv, work, r, args.tokens)
                runs.setdefault(srv.name, []).append(m)
                print(f"round {r + 1} {srv.name:28s} turn 1 {m['wall1']:5.1f} s {m['tps1']:5.1f} tok/s | turn 2 "
                      f"{m['wall2']:5.1f} s {m['tps2']:5.1f} tok/s, median request {m['req2']:4.2f} s, "
                      f"cached {m['cached2']}/{m['prompt2']} prompt tokens", flush=True)
    print(f"\nmedians; in brackets each server's ratio to {servers[0].name} (turn 2: the conversations' next turns)")
    base = {k: statistics.median(m[k] for m in runs[servers[0].name]) for k in ("tps1", "tps2")}
    for name, ms in runs.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ("tps1", "tps2", "req2")}
        print(f"{name:28s} turn 1 {med['tps1']:5.1f} tok/s ({med['tps1'] / base['tps1']:.2f}x) | turn 2 "
              f"{med['tps2']:5.1f} tok/s ({med['tps2'] / base['tps2']:.2f}x), median request {med['req2']:4.2f} s, "
              f"cached {statistics.median(m['cached2'] / m['prompt2'] for m in ms):.0%} of its prompt tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
