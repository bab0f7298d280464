"""Download throughput: our resumable, sha256-verified path vs plain `curl` (and hf_hub_download) of the same file.

One run each, from the same local hub server (tests/hubserver.py) serving the 253 MB starter model,
written to the same disk. Ours includes everything a user gets: metadata calls, the sha256 check and
the move into the HF cache. Prints a table and the ratio ours/curl (target >= 0.9x).

    .venv/bin/python bench/download.py [--file PATH] [--chunk BYTES]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.hubserver import HubServer  # noqa: E402

REPO, NAME = "bench/starter-GGUF", "gemma-3-270m-Q4_K_M.gguf"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(src: Path, work: Path, rate_bps: float | None, chunk: int | None) -> list[tuple[str, float]]:
    from ggufdesk.core import downloads

    size = src.stat().st_size
    rows: list[tuple[str, float]] = []
    tag = "link" if rate_bps else "loopback"
    with HubServer({REPO: {NAME: src}}, rate_bps=rate_bps) as hub, hub.endpoint_patched():
        url = f"{hub.url}/{REPO}/resolve/main/{NAME}"

        def curl() -> None:
            subprocess.run(["curl", "-sfL", "-o", str(work / f"curl-{tag}.gguf"), url], check=True)

        def ours() -> None:
            kw = {"chunk_size": chunk} if chunk else {}
            got = downloads.download(REPO, NAME, cache_dir=work / f"ours-{tag}", **kw)
            assert got.bytes == size and got.sha256 == hub.sha256(REPO, NAME)

        def hf() -> None:
            from huggingface_hub import hf_hub_download

            hf_hub_download(REPO, NAME, cache_dir=work / f"hf-{tag}")

        rows.append(("curl -L (no checks)", timed(curl)))
        rows.append(("ggufdesk download (resumable + sha256)", timed(ours)))
        rows.append(("huggingface_hub hf_hub_download", timed(hf)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", type=Path, help="file to serve (default: the starter model)")
    ap.add_argument("--chunk", type=int, default=None, help="our network chunk (default: downloads.CHUNK)")
    ap.add_argument("--link-mbs", type=float, default=100.0,
                    help="second run: the server paced to this many MB/s, like a fast home link (0: skip)")
    args = ap.parse_args()
    from ggufdesk.core.starter import starter_model_path

    src = args.file or starter_model_path()
    size = src.stat().st_size
    work = Path(tempfile.mkdtemp(prefix="ggufdesk-bench-"))
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    src.read_bytes()  # page cache warm for every contender
    runs = [("loopback, unpaced", None)]
    if args.link_mbs:
        runs.append((f"paced at {args.link_mbs:.0f} MB/s", args.link_mbs * 1e6))
    ratios = []
    print(f"file: {src.name}, {size / 1e6:.1f} MB, local hub server on 127.0.0.1, one run each, "
          f"{os.cpu_count()} CPUs\n")
    print(f"| {'server':<20} | {'path':<40} | {'seconds':>7} | {'MB/s':>6} | {'vs curl':>7} |")
    print(f"|{'-' * 22}|{'-' * 42}|{'-' * 9}|{'-' * 8}|{'-' * 9}|")
    try:
        for label, rate in runs:
            rows = measure(src, work, rate, args.chunk)
            base = rows[0][1]
            for name, t in rows:
                print(f"| {label:<20} | {name:<40} | {t:7.2f} | {size / 1e6 / t:6.0f} | {base / t:6.2f}x |")
            ratios.append((label, base / rows[1][1]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    for label, ratio in ratios:
        print(f"ratio ours/curl throughput, {label}: {ratio:.2f}x (target >= 0.9x): "
              f"{'OK' if ratio >= 0.9 else 'BELOW TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
