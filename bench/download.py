"""Download throughput: our resumable, sha256-verified path vs plain `curl` (and hf_hub_download) of the same file.

From the same local hub server (tests/hubserver.py) serving the 253 MB starter model, written to the
same disk. Ours includes everything a user gets: metadata calls, the sha256 check and the move into
the HF cache. With ``--repeat N`` the contenders run in interleaved rounds (curl, ours, hf; ours, hf,
curl; ...) so that load from other processes hits them alike; the table shows median seconds, and the
ratio is the median of the per-round ratios ours/curl (target >= 0.9x).

    .venv/bin/python bench/download.py [--repeat N] [--file PATH] [--chunk BYTES] [--link-mbs MBS]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hubserver import HubServer

REPO, NAME = "bench/starter-GGUF", "gemma-3-270m-Q4_K_M.gguf"
NAMES = ("curl -L (no checks)", "ggufdesk download (resumable + sha256)", "huggingface_hub hf_hub_download")


def _cpu() -> float:
    """CPU seconds of this process (the server's threads, our download) and its finished children (curl)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    c, t = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t, _cpu() - c


def cpu_pressure() -> str:
    """The kernel's CPU pressure (share of the last 60 s some task waited for a CPU), if it reports it."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return "n/a"
    return dict(kv.split("=") for kv in line.split()[1:])["avg60"] + "%"


def measure(src: Path, work: Path, rate_bps: float | None, chunk: int | None,
            repeat: int) -> list[list[tuple[float, float]]]:
    """(wall, CPU) seconds per contender (in NAMES order), one entry per round."""
    from ggufdesk.core import downloads

    size = src.stat().st_size
    times: list[list[tuple[float, float]]] = [[], [], []]
    with HubServer({REPO: {NAME: src}}, rate_bps=rate_bps) as hub, hub.endpoint_patched():
        url = f"{hub.url}/{REPO}/resolve/main/{NAME}"

        def curl() -> None:
            subprocess.run(["curl", "-sfL", "-o", str(work / "curl.gguf"), url], check=True)

        def ours() -> None:
            kw = {"chunk_size": chunk} if chunk else {}
            got = downloads.download(REPO, NAME, cache_dir=work / "ours", **kw)
            assert got.bytes == size and got.sha256 == hub.sha256(REPO, NAME) and not got.from_cache

        def hf() -> None:
            from huggingface_hub import hf_hub_download

            hf_hub_download(REPO, NAME, cache_dir=work / "hf")

        for r in range(repeat):
            for i in (r + k for k in range(3)):  # each round starts with the next one: no fixed order
                (work / "curl.gguf").unlink(missing_ok=True)  # every run starts from nothing,
                shutil.rmtree(work / "ours", ignore_errors=True)
                shutil.rmtree(work / "hf", ignore_errors=True)
                os.sync()  # with no dirty pages of the previous run still being written back
                times[i % 3].append(timed((curl, ours, hf)[i % 3]))
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, help="file to serve (default: the starter model)")
    ap.add_argument("--chunk", type=int, default=None, help="our network chunk (default: downloads.CHUNK)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds; medians are printed")
    ap.add_argument("--link-mbs", type=float, default=100.0,
                    help="second run: the server paced to this many MB/s, like a fast home link (0: skip)")
    args = ap.parse_args()
    from ggufdesk.core.starter import starter_model_path

    src = args.file or starter_model_path()
    size = src.stat().st_size
    work = Path(tempfile.mkdtemp(prefix="ggufdesk-bench-"))
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    data = src.read_bytes()  # page cache warm for every contender
    hash_cpu = min(timed(lambda: hashlib.sha256(data).digest())[1] for _ in range(3))
    data = b""  # free it: the downloads below measure the network path
    runs = [("loopback, unpaced", None)]
    if args.link_mbs:
        runs.append((f"paced at {args.link_mbs:.0f} MB/s", args.link_mbs * 1e6))
    ratios = []
    how = "one run each" if args.repeat == 1 else f"median of {args.repeat} interleaved rounds"
    print(f"file: {src.name}, {size / 1e6:.1f} MB, local hub server on 127.0.0.1, {how}, "
          f"{os.cpu_count()} CPUs\n")
    print(f"| {'server':<20} | {'path':<40} | {'seconds':>7} | {'MB/s':>6} | {'vs curl':>7} | {'CPU s':>5} |")
    print(f"|{'-' * 22}|{'-' * 42}|{'-' * 9}|{'-' * 8}|{'-' * 9}|{'-' * 7}|")
    try:
        for label, rate in runs:
            times = measure(src, work, rate, args.chunk, args.repeat)
            for name, ts in zip(NAMES, times):
                ratio = statistics.median(c[0] / t[0] for c, t in zip(times[0], ts))
                t = statistics.median(x[0] for x in ts)
                cpu = statistics.median(x[1] for x in ts)
                print(f"| {label:<20} | {name:<40} | {t:7.2f} | {size / 1e6 / t:6.0f} | {ratio:6.2f}x | "
                      f"{cpu:5.2f} |", flush=True)
            per_round = [c[0] / t[0] for c, t in zip(times[0], times[1])]
            ratios.append((label, statistics.median(per_round), min(per_round), max(per_round)))
            if rate is None:
                extra = statistics.median(t[1] - c[1] for c, t in zip(times[0], times[1]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nCPU s: user+system seconds of the download, the in-process server's share included. "
          f"CPU pressure (avg60) at the end: {cpu_pressure()} (0% = the CPUs were ours alone)")
    print(f"ours costs {extra:.2f} CPU s more than curl; sha256 of this file alone costs {hash_cpu:.2f} CPU s "
          f"here: ours can match curl's time only while a second core is free to hash")
    for label, ratio, lo, hi in ratios:
        spread = f" (rounds {lo:.2f}..{hi:.2f})" if args.repeat > 1 else ""
        print(f"ratio ours/curl throughput, {label}: {ratio:.2f}x{spread} (target >= 0.9x): "
              f"{'OK' if ratio >= 0.9 else 'BELOW TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
