"""Router benchmark: a JIT load's time to first token, memory after idle unload, and two models served at once.

Runs `ggufdesk serve A B` (models loaded when a request names them) and measures, in one run:

1. TTFT of a streamed chat request that triggers the JIT load of A (the chat starter by default),
   against TTFT of the same request once A is loaded (median of --reps);
2. RSS of the server's process tree (the server and its engine processes) idle with nothing loaded,
   with A loaded, and after A's idle unload (--idle-unload S): the last should be back within 5% of
   the first. The idle baseline is taken after one load and unload of B: the server's first load
   imports the planner, NVML and the engine client once (~14 MB on a tiny model, flat afterwards);
3. with A and B both loaded, the aggregate decode rate of 2 clients on A + 2 on B against 4 on A
   (same prompt, greedy, --tokens each; the rounds alternate so machine drift hits both alike), on a
   second server that never unloads (so no round pays for a reload).

    python bench/router.py                          # the chat starter (A) and the Gemma base starter (B)
    python bench/router.py --a PATH_OR_ID --b PATH_OR_ID [--tokens 64] [--reps 5] [--json out.json]
    python bench/router.py --tiny                   # a quick check on two tiny synthetic models
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.serving import ServeProcess  # noqa: E402 - after the path is set

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants (the server and its engines), in bytes."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def settle_rss(pid: int, seconds: float = 2.0) -> int:
    """The tree's RSS after it has been quiet a moment (the median of a few reads)."""
    reads = []
    for _ in range(5):
        time.sleep(seconds / 5)
        reads.append(tree_rss(pid))
    return int(statistics.median(reads))


async def stream_one(client: httpx.AsyncClient, url: str, model: str, tokens: int) -> tuple[float, int, float]:
    """(TTFT s, completion tokens, total s) of one streamed chat request."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, n = None, 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices") or []:
                if ttft is None and (c.get("delta") or {}).get("content"):
                    ttft = time.perf_counter() - t0
    return ttft if ttft is not None else float("nan"), n, time.perf_counter() - t0


async def aggregate(url: str, models: list[str], tokens: int) -> float:
    """Tokens per second over all streams of one round (clients start together)."""
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        out = await asyncio.gather(*(stream_one(c, url, m, tokens) for m in models))
        return sum(n for _, n, _ in out) / (time.perf_counter() - t0)


def state(url: str, model: str) -> str:
    return next(m["state"] for m in httpx.get(url + "/v1/models").json()["data"] if m["id"] == model)


def wait_unloaded(url: str, model: str, within: float) -> None:
    deadline = time.monotonic() + within
    while state(url, model) != "unloaded":
        if time.monotonic() > deadline:
            raise SystemExit(f"{model} was not unloaded within {within:.0f} s")
        time.sleep(0.25)


def jit_and_memory(server: ServeProcess, ida: str, idb: str, args: argparse.Namespace) -> dict[str, object]:
    """TTFT with and without a JIT load of A; the tree's RSS idle, with A, and after A's idle unload."""
    url, pid = server.url, server.proc.pid

    async def one(model: str) -> float:
        async with httpx.AsyncClient(timeout=600) as c:
            return (await stream_one(c, url, model, 8))[0]

    asyncio.run(one(idb))  # the warm-up cycle (see the docstring)
    wait_unloaded(url, idb, args.idle_unload + 60)
    rss_idle = settle_rss(pid)
    cold = asyncio.run(one(ida))
    warm = statistics.median(asyncio.run(one(ida)) for _ in range(args.reps))
    rss_loaded = settle_rss(pid)
    print(f"TTFT, {ida}: JIT load {cold:.3f} s, loaded {warm:.3f} s (median of {args.reps}), {cold / warm:.1f}x")
    wait_unloaded(url, ida, args.idle_unload + 60)
    rss_after = settle_rss(pid)
    off = abs(rss_after - rss_idle) / rss_idle
    print(f"RSS of the server tree: idle {rss_idle / 2**20:.0f} MiB, {ida} loaded {rss_loaded / 2**20:.0f} MiB, "
          f"after idle unload {rss_after / 2**20:.0f} MiB ({off * 100:.1f}% from idle: "
          f"{'within' if off <= 0.05 else 'NOT within'} 5%)")
    return {"ttft_jit_load_s": round(cold, 4), "ttft_loaded_s": round(warm, 4), "ttft_ratio": round(cold / warm, 1),
            "rss_idle_bytes": rss_idle, "rss_loaded_bytes": rss_loaded, "rss_after_unload_bytes": rss_after,
            "rss_after_vs_idle": round(rss_after / rss_idle, 4), "rss_within_5pct": off <= 0.05}


def two_models(url: str, ida: str, idb: str, args: argparse.Namespace) -> dict[str, object]:
    """Aggregate tok/s: 2 clients on A + 2 on B against 4 on A, both models loaded, rounds alternating."""
    asyncio.run(aggregate(url, [ida, idb], 4))  # load both
    split, single = [], []
    for _ in range(args.reps):
        split.append(asyncio.run(aggregate(url, [ida, ida, idb, idb], args.tokens)))
        single.append(asyncio.run(aggregate(url, [ida] * 4, args.tokens)))
    ms, m1 = statistics.median(split), statistics.median(single)
    print(f"aggregate decode: 2 clients on {ida} + 2 on {idb} {ms:.1f} tok/s vs 4 on {ida} {m1:.1f} tok/s "
          f"({ms / m1:.2f}x; median of {args.reps} rounds of 4 x {args.tokens} tokens)")
    return {"tok_s_2a_2b": round(ms, 1), "tok_s_4a": round(m1, 1), "tok_s_ratio": round(ms / m1, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="smollm2-135m-instruct", help="model A (path or library id)")
    ap.add_argument("--b", default="gemma-3-270m", help="model B (path or library id)")
    ap.add_argument("--tiny", action="store_true", help="two tiny synthetic models (a quick check that it runs)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request in the aggregate rounds")
    ap.add_argument("--reps", type=int, default=5, help="warm TTFT requests and aggregate rounds")
    ap.add_argument("--threads", type=int, default=0, help="engine threads (0 = physical cores)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--idle-unload", type=float, default=5.0, help="seconds before an idle model is unloaded")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the tiny models and the servers' home
    a, b = args.a, args.b
    if args.tiny:
        from tests.fixtures import ggufs

        a = str(ggufs.write_tiny_llama(tmp / "tiny-a.gguf", ggufs.TinySpec(seed=0)))
        b = str(ggufs.write_tiny_llama(tmp / "tiny-b.gguf", ggufs.TinySpec(seed=3, n_layer=1)))
    # The starters and the app's own settings are wanted here: only the config (presets) is isolated.
    home = tmp / "home"
    extra = ["--ctx", str(args.ctx), "--parallel", "4", *(["--threads", str(args.threads)] if args.threads else [])]
    out: dict[str, object] = {"tokens": args.tokens, "reps": args.reps}
    server = ServeProcess([a, b], *extra, "--idle-unload", str(args.idle_unload), home=home, timeout=600)
    try:
        ida, idb = [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]][:2]
        out.update(a=ida, b=idb)
        out.update(jit_and_memory(server, ida, idb, args))
    finally:
        server.stop()
    server = ServeProcess([a, b], *extra, "--idle-unload", "0", home=home, timeout=600)
    try:
        out.update(two_models(server.url, ida, idb, args))
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
