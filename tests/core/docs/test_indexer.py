"""Indexing: incremental re-index, hostile files and folders, cancel, a file deleted mid-index, a full disk."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ggufdesk.core.docs import walk as W
from ggufdesk.core.docs.indexer import Indexer, Progress
from ggufdesk.core.docs.store import Collection, IndexFull, collection_path, delete_collection, list_collections
from ggufdesk.session.docs import Retriever
from tests.core.docs.conftest import make_collection
from tests.fixtures import corpus


def folder(tmp_path: Path, n: int = 6) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(n):
        (root / f"f{i}.md").write_text(f"# file {i}\n\nThe token word{i} appears here.\n", encoding="utf-8")
    return root


def search(coll: Collection, query: str) -> list[str]:
    return [Path(h.source).name for h in Retriever(coll).search(query, 5)]


def test_reindex_reads_only_the_files_that_changed(tmp_path):
    root = folder(tmp_path)
    coll = make_collection(tmp_path)
    first = Indexer(coll).run([root])
    assert first.added == 6 and len(first.touched) == 6
    (root / "f1.md").write_text("# file 1\n\nnow it says zebra\n", encoding="utf-8")  # changed
    (root / "f2.md").touch()  # new time, same content: not re-read for passages
    os.utime(root / "f2.md", ns=(time.time_ns(), time.time_ns() + 10**9))
    (root / "f3.md").unlink()  # gone
    (root / "new.md").write_text("a new file about giraffes\n", encoding="utf-8")  # new
    again = Indexer(coll).run()  # the collection's own roots
    assert sorted(Path(p).name for p in again.touched) == ["f1.md", "new.md"]
    assert (again.added, again.updated, again.removed, again.unchanged) == (1, 1, 1, 4)
    assert search(coll, "zebra") == ["f1.md"] and search(coll, "word1") == []
    assert search(coll, "word3") == [] and search(coll, "giraffes") == ["new.md"]
    third = Indexer(coll).run()
    assert third.touched == [] and third.bytes_read == 0 and third.unchanged == 6


def test_hostile_files_are_each_skipped_with_a_note_and_nothing_else_is_lost(tmp_path, monkeypatch):
    root = folder(tmp_path)
    (root / "broken.pdf").write_bytes(b"%PDF-1.4\n" + os.urandom(5000))
    (root / "binary.txt").write_bytes(os.urandom(20000).replace(b"\n", b"") + b"\x00\x00")
    (root / "empty.md").write_bytes(b"")
    locked = root / "locked"
    locked.mkdir()
    (locked / "secret.md").write_text("hidden words\n", encoding="utf-8")
    os.chmod(locked, 0)
    (root / "loop").symlink_to(root, target_is_directory=True)  # a link back up: a loop
    (root / "dangling.md").symlink_to(root / "nowhere.md")
    real_scandir = os.scandir

    def scandir(path):  # root ignores permissions: make the locked folder unreadable for it too
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(W.os, "scandir", scandir)
    coll = make_collection(tmp_path)
    try:
        report = Indexer(coll).run([root])
    finally:
        os.chmod(locked, 0o755)
    notes = {Path(p).name: reason for p, reason in report.notes}
    assert "PDF" in notes["broken.pdf"]
    assert "binary" in notes["binary.txt"]
    assert "empty" in notes["empty.md"]
    assert "cannot be read" in notes["locked"]
    assert "loop" in notes["loop"]
    assert "broken link" in notes["dangling.md"]
    assert report.added == 6 and all(search(coll, f"word{i}") == [f"f{i}.md"] for i in range(6))
    # a second run does not read the bad files again, and still names them
    again = Indexer(coll).run()
    assert again.bytes_read == 0 and {"broken.pdf", "binary.txt", "empty.md"} <= {Path(p).name for p, _ in again.notes}


def test_a_file_deleted_while_indexing_is_noted_and_the_rest_indexed(tmp_path):
    root = folder(tmp_path)
    doomed = root / "f4.md"

    def progress(p: Progress) -> None:
        if p.phase == "indexing" and p.files_done == 2 and doomed.exists():
            doomed.unlink()

    coll = make_collection(tmp_path)
    report = Indexer(coll, on_progress=progress).run([root])
    assert [(Path(p).name, r) for p, r in report.notes] == [("f4.md", "went away while indexing")]
    assert report.added == 5 and search(coll, "word4") == [] and search(coll, "word5") == ["f5.md"]


def test_a_reader_that_crashes_costs_only_its_own_file(tmp_path, monkeypatch):
    from ggufdesk.core.docs import indexer as I

    real = I.extract

    def extract(path, kind=None, where=None):
        if path.name == "f2.md":
            raise RuntimeError("reader bug")
        return real(path, kind, where) if where else real(path, kind)

    monkeypatch.setattr(I, "extract", extract)
    coll = make_collection(tmp_path)
    report = Indexer(coll).run([folder(tmp_path)])
    assert [(Path(p).name, "reader bug" in r) for p, r in report.notes] == [("f2.md", True)]
    assert report.added == 5


def test_cancel_keeps_what_was_finished_and_the_next_run_completes(tmp_path):
    root = folder(tmp_path, 10)
    cancel = threading.Event()

    def progress(p: Progress) -> None:
        if p.files_done >= 4:
            cancel.set()

    coll = make_collection(tmp_path)
    report = Indexer(coll, on_progress=progress, cancel=cancel).run([root])
    assert report.cancelled and report.added == 4
    rest = Indexer(coll).run()
    assert not rest.cancelled and rest.added == 6 and rest.unchanged == 4


def test_progress_counts_files_and_bytes_and_gives_an_eta(tmp_path):
    root = folder(tmp_path, 5)
    ticks = iter(range(1000))
    seen: list[Progress] = []
    coll = make_collection(tmp_path)
    Indexer(coll, on_progress=lambda p: seen.append(Progress(**{f: getattr(p, f) for f in p.__slots__})),
            clock=lambda: float(next(ticks))).run([root])
    indexing = [p for p in seen if p.phase == "indexing"]
    assert indexing[-1].files_done == 5 and indexing[-1].files_total == 5
    assert indexing[-1].bytes_done == indexing[-1].bytes_total > 0
    assert indexing[0].eta_s is not None and indexing[0].eta_s > 0  # from the rate so far
    assert seen[-1].phase == "done"


def test_a_full_disk_while_indexing_leaves_the_old_index_usable(tmp_path):
    root = folder(tmp_path)
    path = tmp_path / "full.sqlite3"
    with Collection(path, create=True) as coll:
        Indexer(coll).run([root])
        before = search(coll, "word2")
    big = root / "big.md"
    big.write_text("\n".join(f"line {i} about otters and their rivers" for i in range(200_000)), encoding="utf-8")
    (root / "f2.md").write_text("changed: now about herons\n", encoding="utf-8")
    with Collection(path) as coll:
        pages = coll.conn.execute("PRAGMA page_count").fetchone()[0]
        coll.conn.execute(f"PRAGMA max_page_count = {pages + 20}")  # the disk fills during big.md
        with pytest.raises(IndexFull, match="previous state"):
            Indexer(coll).run()
    with Collection(path) as coll:
        assert coll.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert "big.md" not in {Path(p).name for p in coll.files()}  # not half-written
        assert search(coll, "word1") == ["f1.md"]  # everything else answers as before
        assert search(coll, "word2") == before or search(coll, "herons") == ["f2.md"]
        again = Indexer(coll).run()  # with room again, the same run finishes the job
        assert "big.md" in {Path(p).name for p in again.touched}


def test_collections_live_in_the_data_dir_and_deleting_one_deletes_its_files(tmp_path):
    coll = Collection.open("notes", create=True)
    Indexer(coll).run([folder(tmp_path)])
    coll.close()
    path = collection_path("notes")
    assert path.exists() and list_collections() == ["notes"]
    assert str(path).startswith(os.environ["XDG_DATA_HOME"])
    assert delete_collection("notes") and not path.exists() and not Path(f"{path}-wal").exists()
    assert list_collections() == [] and not delete_collection("notes")


def test_a_root_that_is_gone_keeps_its_files_until_it_is_back(tmp_path):
    root = folder(tmp_path)
    coll = make_collection(tmp_path)
    Indexer(coll).run([root])
    root.rename(tmp_path / "away")  # an unplugged drive
    report = Indexer(coll).run()
    assert report.removed == 0 and any("does not exist" in r for _, r in report.notes)
    assert search(coll, "word0") == ["f0.md"]


MEASURE = """
import json, resource, sys
from pathlib import Path
from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection
from ggufdesk.session.docs import Retriever
coll = Collection(Path(sys.argv[1]), create=True)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
report = Indexer(coll).run([Path(sys.argv[2])])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
hit = Retriever(coll).search(sys.argv[3], 1)[0]
print(json.dumps({"base_kb": base, "peak_kb": peak, "chunks": report.chunks, "added": report.added,
                  "text": hit.text, "line": hit.lines[0]}))
"""


def test_a_40_mb_text_file_is_indexed_in_bounded_memory(tmp_path_factory):
    """Streamed: the process's peak memory grows by far less than the file's size (a fresh process, so
    the peak is this run's)."""
    import json
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("big")
    fact = "The calibration constant for the Arden flow meter is 0.9417 at twenty degrees."
    corpus.big_text(root / "huge.txt", 40, fact=fact)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(root / "big.sqlite3"), str(root / "huge.txt"),
                          "Arden flow meter calibration constant"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["added"] == 1 and got["chunks"] > 40_000
    grew_mb = (got["peak_kb"] - got["base_kb"]) / 1024
    assert grew_mb < 32, f"indexing 40 MB grew the process by {grew_mb:.0f} MB"
    assert "0.9417" in got["text"] and got["line"] > 100_000
