"""`python -m ggufdesk.catalog.refresh`: rewrite the catalog's files, sizes and sha256 from the hub's metadata.

For every model in the catalog it lists the repo's GGUF files (core/downloads.list_gguf: the hub's
tree with each file's size and LFS sha256, split sets grouped), keeps the quants a newcomer would pick
(PREFERRED, in that order, at most MAX_QUANTS), and writes the catalog back. A repo that cannot be
read keeps the files it had and is reported; the exit status is then 1, so a rerun is due. The hub is
HF_ENDPOINT's (huggingface_hub's own setting) or --endpoint. Nothing is invented: a file the hub gives
no sha256 for (not LFS) is written "missing", and the download checks it against the hub then.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ggufdesk.core import catalog as C
from ggufdesk.core.downloads import RemoteFile, RemoteModel
from ggufdesk.core.errors import KnownError

PREFERRED = ("Q4_K_M", "MXFP4", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "IQ4_XS", "Q3_K_M", "BF16", "F16")
MAX_QUANTS = 4


def header(source: Path) -> str:
    """The comment block on top of the catalog file (kept as it is)."""
    lines = []
    for line in source.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n"


def files_of(models: list[RemoteModel]) -> tuple[C.CatalogFile, ...]:
    """The preferred quants of a repo's models (core/downloads.RemoteModel), best first."""
    by_quant: dict[str, RemoteModel] = {}
    for m in models:
        if m.quant and m.quant not in by_quant:
            by_quant[m.quant] = m
    out: list[C.CatalogFile] = []
    for q in PREFERRED:
        if q in by_quant and len(out) < MAX_QUANTS:
            m = by_quant[q]
            out.append(C.CatalogFile(q, m.first, m.size, tuple(f.path for f in m.files),
                                     tuple(f.sha256 for f in m.files)))
    return tuple(out)


def refresh(cat: C.Catalog, list_files: Callable[[str], list[RemoteModel]],
            projector: Callable[[str, str], RemoteFile | None] | None = None) -> tuple[C.Catalog, list[str]]:
    """The catalog with every model's files read anew, and a vision model's projector (projector(repo,
    model file) -> the repo's file that pairs, core/downloads.projector_for); (catalog, the problems met)."""
    entries, problems = [], []
    for e in cat.entries:
        try:
            files = files_of(list_files(e.repo))
            mmproj = e.mmproj
            if projector is not None and "vision" in e.capabilities and files:
                found = projector(e.repo, files[0].file)
                mmproj = C.CatalogFile("mmproj", found.path, found.size, (found.path,), (found.sha256,)) \
                    if found is not None else None
                if found is None:
                    problems.append(f"{e.id}: {e.repo} has no vision projector (mmproj); it will read text only")
        except KnownError as err:
            problems.append(f"{e.id}: {err} (its files are kept as they were)")
            entries.append(e)
            continue
        if not files:
            problems.append(f"{e.id}: {e.repo} has none of the quants {', '.join(PREFERRED)}")
        entries.append(replace(e, files=files, mmproj=mmproj))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return replace(cat, entries=tuple(entries), refreshed=stamp), problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ggufdesk.catalog.refresh", description=__doc__.split("\n")[0])
    ap.add_argument("--catalog", type=Path, default=None, help="the catalog to read (default: the shipped one)")
    ap.add_argument("--output", type=Path, default=None, help="where to write it (default: over --catalog)")
    ap.add_argument("--endpoint", default=None, help="the hub's URL (default: HF_ENDPOINT or huggingface.co)")
    args = ap.parse_args(argv)
    from ggufdesk.core import downloads

    source = args.catalog or C.default_path()
    cat = C.load(source)
    if cat.warnings:
        print("the catalog has problems; fix them first:\n  " + "\n  ".join(cat.warnings), file=sys.stderr)
        return 2
    new, problems = refresh(cat, lambda repo: downloads.list_gguf(repo, endpoint=args.endpoint),
                            lambda repo, file: downloads.projector_for(repo, file, endpoint=args.endpoint))
    out = args.output or source
    out.write_text(C.dumps(new, header=header(source)), encoding="utf-8")
    n_files = sum(len(e.files) for e in new.entries)
    print(f"{out}: {len(new.entries)} models, {n_files} files from the hub ({new.refreshed})")
    for p in problems:
        print("  " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
