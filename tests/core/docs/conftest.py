"""The generated corpus (tests/fixtures/corpus.py), written once per session in a temp folder, and its index."""
from __future__ import annotations

from pathlib import Path

import pytest

from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection
from tests.fixtures import corpus


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> tuple[Path, list[corpus.Placed]]:
    root = tmp_path_factory.mktemp("corpus")
    return root, corpus.build(root, files=300)


@pytest.fixture(scope="session")
def corpus_index(corpus_dir, tmp_path_factory) -> Path:
    """The corpus indexed (BM25 only) into a collection file; tests open it read-only in spirit."""
    root, _ = corpus_dir
    path = tmp_path_factory.mktemp("index") / "corpus.sqlite3"
    with Collection(path, create=True) as coll:
        report = Indexer(coll).run([root])
    assert report.added == 300 and not report.notes, report.notes
    return path


def make_collection(tmp_path: Path, name: str = "c") -> Collection:
    return Collection(tmp_path / f"{name}.sqlite3", create=True)
