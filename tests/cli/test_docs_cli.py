"""`ggufdesk docs add|list|remove|search` and `chat --docs NAME` as docs/architecture.md's CLI contract says."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ggufdesk.cli import build_parser, main
from ggufdesk.cli import chat as chat_cmd


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(list(argv))
    return rc, json.loads(capsys.readouterr().out)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "otters.md").write_text("# Otters\n\nRiver otters eat mostly fish and crayfish.\n", encoding="utf-8")
    (root / "bad.pdf").write_bytes(b"%PDF-1.4 garbage")
    sub = root / "deeper"
    sub.mkdir()
    (sub / "herons.txt").write_text("Grey herons nest in colonies\ncalled heronries.\n", encoding="utf-8")
    return root


def test_add_list_search_remove(capsys, docs):
    rc, out = run_json(capsys, "docs", "add", "nature", str(docs), "--json")
    assert rc == 0 and out["files"] == 3 and out["chunks"] == 2 and out["vectors"] is False
    assert out["run"]["added"] == 2 and [Path(s["path"]).name for s in out["run"]["skipped"]] == ["bad.pdf"]
    rc, out = run_json(capsys, "docs", "list", "--json")
    assert [c["name"] for c in out["collections"]] == ["nature"] and out["collections"][0]["roots"] == [str(docs)]
    rc, out = run_json(capsys, "docs", "search", "nature", "where do herons nest", "--k", "5", "--json")
    assert rc == 0 and len(out["results"]) == 1
    r = out["results"][0]
    assert set(r) == {"source", "page", "lines", "score", "text"}
    assert r["source"] == str(docs / "deeper" / "herons.txt") and r["lines"] == [1, 2] and r["page"] is None
    assert "heronries" in r["text"] and r["score"] > 0
    rc, out = run_json(capsys, "docs", "list", "nature", "--json")
    assert {Path(f["path"]).name: f["note"] != "" for f in out["files"]} == \
        {"otters.md": False, "herons.txt": False, "bad.pdf": True}
    rc, out = run_json(capsys, "docs", "remove", "nature", "--json")
    assert out == {"removed": "nature"}
    rc, out = run_json(capsys, "docs", "list", "--json")
    assert out == {"collections": []}


def test_add_again_reads_only_changes_and_search_follows(capsys, docs):
    run_json(capsys, "docs", "add", "nature", str(docs), "--json")
    (docs / "otters.md").write_text("Otters now eat eels.\n", encoding="utf-8")
    rc, out = run_json(capsys, "docs", "add", "nature", "--json")  # no paths: the collection's own
    assert out["run"]["updated"] == 1 and out["run"]["unchanged"] == 2
    rc, out = run_json(capsys, "docs", "search", "nature", "eels", "--json")
    assert [Path(r["source"]).name for r in out["results"]] == ["otters.md"]


@pytest.mark.parametrize("argv, message", [
    (["docs", "search", "nope", "x", "--json"], "there is no collection 'nope'"),
    (["docs", "add", "bad name!", "/tmp", "--json"], "not a collection name"),
    (["docs", "add", "fresh", "--json"], "name the files or folders"),
    (["docs", "add", "fresh", "/no/such/folder", "--json"], "not found: /no/such/folder"),
    (["docs", "remove", "nope", "--json"], "there is no collection 'nope'"),
    (["docs", "add", "c", "/tmp", "--embed-model", "/no/model.gguf", "--json"], "no such file"),
    (["docs", "add", "c", "/tmp", "--embed-model", "nomodel", "--json"], "neither a file nor a model"),
])
def test_bad_input_gets_one_clear_error(capsys, argv, message):
    rc = main(argv)
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and message in out["error"]


def test_search_k_out_of_range(capsys, docs):
    run_json(capsys, "docs", "add", "nature", str(docs), "--json")
    rc, out = run_json(capsys, "docs", "search", "nature", "otters", "--k", "0", "--json")
    assert rc == 1 and "--k" in out["error"]


def test_chat_with_docs_cites_its_sources(tiny_model, docs, capsys):
    main(["docs", "add", "nature", str(docs), "--json"])
    capsys.readouterr()
    args = build_parser().parse_args(["chat", str(tiny_model), "--docs", "nature", "--ctx", "1024",
                                      "--max-tokens", "4", "--temperature", "0"])
    out = io.StringIO()
    rc = chat_cmd.run(args, stdin=io.StringIO("what do otters eat?\n/exit\n"), stdout=out)
    text = out.getvalue()
    assert rc == 0, text
    assert "answering from 'nature': keyword (BM25) search only" in text
    assert "Sources:\n  [1] " + str(docs / "otters.md") + ", lines 1-3" in text


def test_chat_with_an_unknown_collection_says_how_to_make_one(tiny_model):
    from ggufdesk.core.errors import KnownError

    args = build_parser().parse_args(["chat", str(tiny_model), "--docs", "nope"])
    with pytest.raises(KnownError, match="ggufdesk docs add nope PATH"):
        chat_cmd.run(args, stdin=io.StringIO(""), stdout=io.StringIO())


def test_add_with_an_embedding_model_makes_a_hybrid_collection(capsys, tmp_path, tiny_model):
    """The plumbing with the tiny synthetic model (its vectors mean nothing): our engine embeds the
    passages into sqlite-vec, and the query with the same model; the search says it is hybrid."""
    root = tmp_path / "few"
    root.mkdir()
    (root / "a.md").write_text("Otters eat fish.\n", encoding="utf-8")
    (root / "b.md").write_text("Herons nest in trees.\n", encoding="utf-8")
    rc, out = run_json(capsys, "docs", "add", "small", str(root), "--embed-model", str(tiny_model), "--json")
    assert rc == 0 and out["vectors"] is True and out["embed_model"] == str(tiny_model.resolve())
    assert out["run"]["vectors"] == "on" and out["chunks"] == 2
    rc, out = run_json(capsys, "docs", "search", "small", "otters", "--json")
    assert out["search"].startswith("hybrid search (BM25 + vectors from tiny-target.gguf)")
    assert Path(out["results"][0]["source"]).name == "a.md" and len(out["results"]) == 2
    (root / "c.md").write_text("Beavers build dams.\n", encoding="utf-8")
    rc, out = run_json(capsys, "docs", "add", "small", "--json")  # the collection's own model again
    assert out["run"]["added"] == 1 and out["vectors"] is True
