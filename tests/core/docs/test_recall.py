"""Known-answer retrieval on the generated corpus: BM25, and hybrid through sqlite-vec.

The vectors here come from a small lexical embedder (hashed word stems and character trigrams): it
tests the vector table, the query path and the fusion, not a real model's quality. A real embedding
model's recall is measured by bench/docs.py (docs/bench/docs.md). Only the tuning half is asserted;
the held-out half is reported by the bench.
"""
from __future__ import annotations

import hashlib
import math
import re

import pytest

from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection
from ggufdesk.session.docs import Retriever
from tests.fixtures import corpus

DIM = 256


def hashed(texts: list[str]) -> list[list[float]]:
    out = []
    for text in texts:
        v = [0.0] * DIM
        words = re.findall(r"\w+", text.lower())
        feats = [w[:5] for w in words] + [w[i:i + 3] for w in words for i in range(max(1, len(w) - 2))]
        for f in feats:
            h = int.from_bytes(hashlib.blake2b(f.encode(), digest_size=4).digest(), "little")
            v[h % DIM] += 1.0 if h & 1 << 31 else -1.0
        n = math.sqrt(sum(x * x for x in v)) or 1.0
        out.append([x / n for x in v])
    return out


def recall(retriever: Retriever, placed: list[corpus.Placed], which: range, k: int = 5) -> float:
    hits = 0
    for i in which:
        found = retriever.search(placed[i].question, k)
        hits += any(corpus.found(placed[i].key, h.text) for h in found)
    return hits / len(which)


def test_bm25_recall_at_5_on_the_tuning_half(corpus_dir, corpus_index):
    _, placed = corpus_dir
    with Collection(corpus_index) as coll:
        assert coll.stats()["files"] == 300
        r = recall(Retriever(coll), placed, corpus.TUNE)
    assert r >= 0.8, r


@pytest.fixture(scope="module")
def hybrid_index(corpus_dir, tmp_path_factory):
    root, _ = corpus_dir
    path = tmp_path_factory.mktemp("hybrid") / "hybrid.sqlite3"
    with Collection(path, create=True) as coll:
        coll.set_embedding("hashed-test-embedder", DIM)
        report = Indexer(coll, embed=hashed, embed_model="hashed-test-embedder").run([root])
        assert report.vectors == "" and report.added == 300
        n_vec = coll.conn.execute("SELECT count(*) FROM chunks_vec").fetchone()[0]
        assert n_vec == coll.stats()["chunks"]  # every passage has its vector
    return path


def test_hybrid_recall_at_5_through_sqlite_vec(corpus_dir, hybrid_index):
    """A floor, not a quality figure: the toy embedder knows no synonyms (0.63 here, against BM25's 0.9),
    so fusing it costs recall; a broken vector path (wrong ids, unnormalised vectors) falls far lower."""
    _, placed = corpus_dir
    with Collection(hybrid_index) as coll:
        retriever = Retriever(coll, embed=hashed)
        assert retriever.mode == "hybrid" and "no reranker" in retriever.note
        r = recall(retriever, placed, corpus.TUNE)
    assert r >= 0.55, r


def test_the_vector_search_finds_a_passage_from_its_own_text(hybrid_index):
    with Collection(hybrid_index) as coll:
        rows = coll.conn.execute("SELECT rowid, text FROM chunks_fts ORDER BY rowid LIMIT 400").fetchall()
        for cid, text in rows[::20]:
            best = coll.search_vector(hashed([text])[0], 1)[0]
            assert best.id == cid or best.text == text
            assert best.score == pytest.approx(1.0, abs=1e-4)  # cosine similarity of a vector with itself


def test_vectors_are_added_later_without_reading_the_files_again(corpus_dir, tmp_path):
    root, placed = corpus_dir
    with Collection(tmp_path / "later.sqlite3", create=True) as coll:
        Indexer(coll).run([root / "section-0"])
        assert not coll.has_vectors and Retriever(coll, embed=hashed).mode == "bm25"
        coll.set_embedding("hashed-test-embedder", DIM)
        report = Indexer(coll, embed=hashed, embed_model="hashed-test-embedder").run()
        assert report.bytes_read == 0 and report.touched == []
        n_vec = coll.conn.execute("SELECT count(*) FROM chunks_vec").fetchone()[0]
        assert n_vec == coll.stats()["chunks"] > 0
        assert Retriever(coll, embed=hashed).mode == "hybrid"


def test_an_embedder_that_fails_leaves_a_bm25_index_and_says_why(corpus_dir, tmp_path):
    from ggufdesk.core.errors import KnownError

    root, _ = corpus_dir
    calls = [0]

    def flaky(texts):
        calls[0] += 1
        if calls[0] > 3:
            raise KnownError("the embedding engine crashed")
        return hashed(texts)

    with Collection(tmp_path / "flaky.sqlite3", create=True) as coll:
        coll.set_embedding("hashed-test-embedder", DIM)
        report = Indexer(coll, embed=flaky, embed_model="hashed-test-embedder").run([root / "section-1"])
        assert "embeddings failed" in report.vectors and not report.notes
        assert report.added == len(coll.files())
        pending = [f for f in coll.files().values() if f.chunks and f.vec_model != "hashed-test-embedder"]
        assert pending  # filled in by the next run with a working model:
        Indexer(coll, embed=hashed, embed_model="hashed-test-embedder").run()
        assert all(f.vec_model == "hashed-test-embedder" for f in coll.files().values() if f.chunks)


def test_retrieval_keeps_sources_pages_and_lines(corpus_dir, corpus_index):
    _, placed = corpus_dir
    pdf = next((p for p in placed if p.path.suffix == ".pdf"), None)
    assert pdf is not None
    with Collection(corpus_index) as coll:
        hits = Retriever(coll).search(pdf.question, 5)
    hit = next(h for h in hits if corpus.found(pdf.key, h.text))
    assert hit.source == str(pdf.path) and hit.page >= 1 and hit.lines[0] >= 1
