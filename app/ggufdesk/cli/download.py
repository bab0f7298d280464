"""`ggufdesk download`: fetch a GGUF (or every part of a split one) into the shared Hugging Face cache."""
from __future__ import annotations

import argparse
import sys
import time

from ggufdesk.cli import print_json
from ggufdesk.core import downloads
from ggufdesk.core.gguf_meta import split_names, split_parts

NAME = "download"
HELP = "download a model file from the Hugging Face hub (resumable, sha256-checked); without FILE, list the repo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repo", metavar="REPO", help="repository id, e.g. unsloth/gemma-3-270m-it-GGUF")
    p.add_argument("file", metavar="FILE", nargs="?", help="file in the repo (the first part of a split model "
                   "fetches all parts); omit it to list the repo's GGUF models")
    p.add_argument("--revision", help="branch, tag or commit to pin (default: main)")
    p.add_argument("--offline", action="store_true", help="only look in the local cache")
    p.add_argument("--no-mmproj", action="store_true",
                   help="a vision model: do not fetch its projector (mmproj) beside it (it then reads text only)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


class _Bar:
    """A one-line progress bar on stderr (TTY only)."""

    def __init__(self, parts: int) -> None:
        self.parts, self.part, self.last = parts, 0, 0.0

    def __call__(self, p: downloads.Progress) -> None:
        now = time.monotonic()
        if p.phase == "download" and now - self.last < 0.2 and p.done < p.total:
            return
        self.last = now
        frac = p.done / p.total if p.total else 1.0
        width = 28
        fill = int(frac * width)
        eta = f" ETA {p.eta_s:4.0f}s" if p.eta_s is not None and p.phase == "download" else ""
        part = f"[{self.part}/{self.parts}] " if self.parts > 1 else ""
        phase = {"verify": " verifying", "done": " done"}.get(p.phase, "")
        sys.stderr.write(f"\r{part}{p.filename[-40:]} |{'#' * fill}{'.' * (width - fill)}| {frac:6.1%} "
                         f"{p.done / 1e6:8.1f}/{p.total / 1e6:.1f} MB {p.speed_bps / 1e6:6.1f} MB/s{eta}{phase}\033[K")
        if p.phase == "done":
            sys.stderr.write("\n")
        sys.stderr.flush()


def _parts(file: str) -> list[str]:
    sp = split_parts(file.rpartition("/")[2])
    if sp is None or sp[1] != 1:
        return [file]
    return split_names(file)


def run(args: argparse.Namespace) -> int:
    if args.file is None:
        _list(args)
        return 0
    names = _parts(args.file)
    bar = _Bar(len(names)) if sys.stderr.isatty() else None
    results = _download(args, names, bar)
    mmproj = None if args.no_mmproj or args.offline else _projector(args, bar)
    _report(args, results, mmproj)
    return 0


def _list(args: argparse.Namespace) -> None:
    """The repo's GGUF models, one a line (or as JSON)."""
    models = downloads.list_gguf(args.repo, revision=args.revision)
    if args.json:
        print_json({"repo": args.repo, "models": [
            {"name": m.name, "quant": m.quant, "bytes": m.size, "files": [f.path for f in m.files]}
            for m in models]})
        return
    for m in models:
        parts = f" ({len(m.files)} parts)" if len(m.files) > 1 else ""
        print(f"{m.quant or '?':>8}  {m.size / 1e9:7.2f} GB  {m.first}{parts}")


def _download(args: argparse.Namespace, names: list[str], bar: _Bar | None) -> list[downloads.Downloaded]:
    """Each part in turn; Ctrl-C says how to resume."""
    results = []
    try:
        for i, name in enumerate(names, 1):
            if bar is not None:
                bar.part = i
            results.append(downloads.download(args.repo, name, revision=args.revision, progress=bar,
                                              offline=True if args.offline else None))
    except KeyboardInterrupt:
        print("\nggufdesk: paused; run the same command again to resume", file=sys.stderr)
        raise
    return results


def _report(args: argparse.Namespace, results: list[downloads.Downloaded],
            mmproj: downloads.Downloaded | None) -> None:
    """The downloaded files: one JSON object (parts and projector inside), or a line each."""
    first = results[0]
    out = first.as_json()
    if len(results) > 1:
        out["bytes"] = sum(r.bytes for r in results)
        out["parts"] = [r.as_json() for r in results]
    out["mmproj"] = mmproj.as_json() if mmproj is not None else None
    if args.json:
        print_json(out)
        return
    for r in results + ([mmproj] if mmproj is not None else []):
        how = "already downloaded" if r.from_cache else (
            f"resumed from {r.resumed_from / 1e6:.1f} MB" if r.resumed_from else "downloaded")
        print(f"{r.path}  ({r.bytes / 1e6:.1f} MB, sha256 {r.sha256[:16]}…, {how})")


def _projector(args: argparse.Namespace, bar: _Bar | None) -> downloads.Downloaded | None:
    """A vision model's projector from the same repo, beside it in the cache, verified like the model."""
    proj = downloads.projector_for(args.repo, args.file, revision=args.revision)
    if proj is None:
        return None
    if bar is not None:
        bar.part, bar.parts = 1, 1
    if not args.json:
        print(f"vision projector: {proj.path} ({proj.size / 1e6:.1f} MB)", file=sys.stderr)
    return downloads.download(args.repo, proj.path, revision=args.revision, progress=bar)
