"""`ggufdesk docs add|list|remove|search`: document collections to chat with (chat --docs NAME, the server's `docs`)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ggufdesk.core.errors import KnownError

if TYPE_CHECKING:
    from ggufdesk.core.docs.indexer import Report
    from ggufdesk.session.docs_index import IndexJob

NAME = "docs"
HELP = "document collections: add files or folders, list, remove, search (then chat --docs NAME)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="docs_command", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="index files or folders into a collection (made if new; re-run: only changes)")
    add.add_argument("name", help="the collection's name")
    add.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (none: re-index the collection)")
    add.add_argument("--embed-model", metavar="MODEL",
                     help="an embedding GGUF (path or library id) for hybrid search; without one: BM25 only")
    add.add_argument("--json", action="store_true", help="print one JSON object (no progress line)")
    ls = sub.add_parser("list", help="the collections, or one collection's files with what was skipped")
    ls.add_argument("name", nargs="?", help="a collection: list its files")
    ls.add_argument("--json", action="store_true")
    rm = sub.add_parser("remove", help="delete a collection's index (your files are not touched)")
    rm.add_argument("name")
    rm.add_argument("--json", action="store_true")
    se = sub.add_parser("search", help="the passages that best match a query")
    se.add_argument("name")
    se.add_argument("query")
    se.add_argument("--k", type=int, default=5, help="how many passages (default 5)")
    se.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    return int({"add": add, "list": list_, "remove": remove, "search": search}[args.docs_command](args))


def resolve_embed_model(model: str) -> str:
    """A path or a library id, as `run` and `serve` take it; the absolute path a collection remembers."""
    from ggufdesk.core import library

    path = library.resolve(model)
    if path.startswith("hf://"):
        raise KnownError("download the embedding model first (ggufdesk download), then name the file or its id")
    return str(Path(path).resolve())


def add(args: argparse.Namespace) -> int:
    from ggufdesk.core.docs.store import check_name, collection_path

    check_name(args.name)
    if not args.paths and not collection_path(args.name).exists():
        raise KnownError(f"there is no collection {args.name!r}: name the files or folders to index")
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise KnownError(f"not found: {', '.join(missing)}")
    model = resolve_embed_model(args.embed_model) if args.embed_model else _collection_model(args.name)
    job = _index(args, model)
    if job.error is not None:
        raise job.error
    assert job.report is not None
    return _print_added(args, job.report)


def _index(args: argparse.Namespace, model: str) -> IndexJob:
    """Index args.paths into the collection (a progress line on a terminal; Ctrl-C cancels), the embedding
    engine running only meanwhile; the finished job."""
    from ggufdesk.session.docs_index import IndexJob, describe
    from ggufdesk.session.embedding import EmbeddingEngine

    engine = EmbeddingEngine(model).start() if model else None
    shown = [0.0]

    def progress(p: Any) -> None:
        now = time.monotonic()
        if not args.json and sys.stderr.isatty() and now - shown[0] > 0.25:
            shown[0] = now
            print(f"\r{describe(p)}\033[K", end="", file=sys.stderr, flush=True)

    try:
        job = IndexJob(args.name, [Path(p) for p in args.paths], embed=engine, embed_model=model,
                       embed_dim=engine.dim if engine else 0, on_progress=progress).start()
        try:
            while not job.wait(0.2):
                pass
        except KeyboardInterrupt:
            job.cancel()
            job.wait()
    finally:
        if engine is not None:
            engine.close()
    if not args.json and sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    return job


def _print_added(args: argparse.Namespace, report: Report) -> int:
    """The collection after the run (JSON, or a summary and what was skipped); 1 when it was cancelled."""
    from ggufdesk.cli import print_json
    from ggufdesk.core.docs.store import Collection
    from ggufdesk.session.docs_index import summary

    with Collection.open(args.name) as coll:
        stats = coll.stats()
    if args.json:
        print_json({**stats, "run": report.as_dict()})
        return 1 if report.cancelled else 0
    print(f"{args.name}: {summary(report)}; {stats['files']} files, {stats['chunks']:,} passages in all")
    for path, reason in report.notes:
        print(f"  skipped {path}: {reason}")
    if report.vectors:
        print(f"  note: {report.vectors}")
    return 1 if report.cancelled else 0


def _collection_model(name: str) -> str:
    """The embedding model an existing collection was made with, if it is still there."""
    from ggufdesk.core.docs.store import Collection, collection_path

    if not collection_path(name).exists():
        return ""
    with Collection.open(name) as coll:
        model = coll.embed_model
    return model if model and Path(model).is_file() else ""


def list_(args: argparse.Namespace) -> int:
    from ggufdesk.cli import print_json
    from ggufdesk.core.docs.store import Collection, list_collections

    if args.name:
        with Collection.open(args.name) as coll:
            stats, files = coll.stats(), coll.files()
        rows = [{"path": f.path, "kind": f.kind, "bytes": f.size, "chunks": f.chunks, "note": f.note}
                for f in sorted(files.values(), key=lambda f: f.path)]
        if args.json:
            print_json({**stats, "files": rows})
            return 0
        for r in rows:
            print(f"{r['path']}  ({r['chunks']} passages)" + (f"  skipped: {r['note']}" if r["note"] else ""))
        return 0
    out = []
    for name in list_collections():
        with Collection.open(name) as coll:
            out.append(coll.stats())
    if args.json:
        print_json({"collections": out})
        return 0
    if not out:
        print("no collections yet: ggufdesk docs add NAME PATH...")
    for c in out:
        search = "hybrid" if c["vectors"] else "BM25 only"
        print(f"{c['name']}: {c['files']} files, {c['chunks']:,} passages, {search}; {', '.join(c['roots'])}")
    return 0


def remove(args: argparse.Namespace) -> int:
    from ggufdesk.cli import print_json
    from ggufdesk.core.docs.store import delete_collection

    if not delete_collection(args.name):
        raise KnownError(f"there is no collection {args.name!r}")
    if args.json:
        print_json({"removed": args.name})
    else:
        print(f"removed the collection {args.name!r} (its index; your files are untouched)")
    return 0


def search(args: argparse.Namespace) -> int:
    from ggufdesk.cli import print_json
    from ggufdesk.session.docs import open_retriever

    if args.k < 1 or args.k > 100:
        raise KnownError("--k must be between 1 and 100")
    with open_retriever(args.name) as retriever:
        hits = retriever.search(args.query, args.k)
        note = retriever.note
    results = [{k: v for k, v in h.as_dict().items() if k != "index"} for h in hits]
    if args.json:
        print_json({"results": results, "search": note})
        return 0
    print(f"({note})")
    for h in hits:
        print(f"\n[{h.index}] {h.label()}  score {h.score:.3f}\n{h.text}")
    return 0
