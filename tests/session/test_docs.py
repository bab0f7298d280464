"""Answers from documents in the session layer: the query, fusion, the budget, citations kept with the answer."""
from __future__ import annotations

from pathlib import Path

from ggufdesk.core.docs.indexer import Indexer
from ggufdesk.core.docs.store import Collection, Passage
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.docs import (Attached, Citation, Retriever, budget_for, fts_query, fuse, ground,
                                   open_retriever)


def hit(i: int, text: str = "x" * 300, source: str = "/d/a.pdf", page: int = 2) -> Citation:
    return Citation(i, source, page, (10 + i, 20 + i), 1.0 / i, text, chunk_id=i)


def test_the_query_keeps_the_words_that_matter_quoted_for_fts5():
    assert fts_query('What does the "uploader" do when it fails?') == '"uploader" OR "fails"'
    assert fts_query("the and of") == ""
    assert fts_query('alpha"beta NEAR gamma*') == '"alpha" OR "beta" OR "near" OR "gamma"'  # FTS5 syntax in the text is only words


def test_reciprocal_rank_fusion_rewards_agreement():
    a, b, c = (Passage(i, "s", 0, 1, 1, "t") for i in (1, 2, 3))
    fused = fuse([[a, b], [c, b]], k=60)
    assert [p.id for p, _ in fused] == [2, 1, 3]
    assert fused[0][1] == 1 / 62 + 1 / 62


def test_ground_places_what_fits_renumbered_and_names_what_was_left_out():
    hits = [hit(1, "a" * 900), hit(2, "b" * 3000), hit(3, "c" * 300)]
    g = ground("What is it?", hits, budget_tokens=800)
    assert [c.chunk_id for c in g.cited] == [1, 3] and [c.index for c in g.cited] == [1, 2]
    assert [c.chunk_id for c in g.left_out] == [2]
    assert "[1] a.pdf, page 2, lines 11-21:" in g.text and "[2] a.pdf, page 2, lines 13-23:" in g.text
    assert g.text.endswith("Question: What is it?") and "[1] or [2]" in g.text
    assert "1 source did not fit" in g.notice() and "lines 12-22" in g.notice()
    stats = g.stats()
    assert [c["index"] for c in stats["citations"]] == [1, 2] and stats["citations"][0]["lines"] == [11, 21]


def test_ground_with_no_room_sends_the_question_alone():
    g = ground("Why?", [hit(1)], budget_tokens=10)
    assert g.text == "Why?" and g.cited == [] and len(g.left_out) == 1


def test_the_budget_leaves_room_for_the_conversation_and_the_answer():
    assert budget_for(4096, conversation="", max_tokens=512) == 4096 - 1024 - 64
    assert budget_for(4096, conversation="x" * 3000, max_tokens=2000) == 4096 - 1000 - 2000 - 64
    assert budget_for(512, conversation="x" * 3000, max_tokens=256) == 0


def collection(tmp_path: Path) -> Collection:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "otters.md").write_text("# Otters\n\nRiver otters eat mostly fish and crayfish.\n", encoding="utf-8")
    (docs / "herons.md").write_text("# Herons\n\nGrey herons nest in colonies called heronries.\n", encoding="utf-8")
    coll = Collection.open("wildlife", create=True)
    Indexer(coll).run([docs])
    return coll


def test_attached_puts_sources_into_the_last_user_message_only(tmp_path):
    coll = collection(tmp_path)
    req = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "What do otters eat?"}],
           "prompt": None}
    g = Attached(Retriever(coll)).apply(req, "What do otters eat?", n_ctx=4096, max_tokens=256)
    assert [Path(c.source).name for c in g.cited] == ["otters.md"]
    assert req["messages"][1]["content"] == "hi" and req["messages"][0]["content"] == "be brief"
    assert "crayfish" in req["messages"][3]["content"] and req["messages"][3]["content"].endswith("What do otters eat?")


def test_attached_in_completion_mode_rewrites_the_tail_of_the_prompt(tmp_path):
    coll = collection(tmp_path)
    req = {"prompt": "Earlier text.\nWhere do herons nest?", "messages": None}
    Attached(Retriever(coll)).apply(req, "Where do herons nest?", n_ctx=4096, max_tokens=256)
    assert req["prompt"].startswith("Earlier text.\n") and "heronries" in req["prompt"]


def test_open_retriever_says_it_is_bm25_only_without_an_embedding_model(tmp_path):
    collection(tmp_path).close()
    with open_retriever("wildlife") as r:
        assert r.mode == "bm25" and "no embedding model" in r.note and r.reranker == "none"
        assert [Path(h.source).name for h in r.search("heron colonies", 5)] == ["herons.md"]


def test_a_session_with_docs_sends_the_sources_and_keeps_the_citations(rig, tmp_path):
    coll = collection(tmp_path)
    rig.session.on_event(P.Loaded(id="l2", model="/m/model.gguf", chat_format="template", n_ctx=4096))
    rig.session.attach_docs(Attached(Retriever(coll)))
    rid = rig.send("What do otters eat?")
    sent = rig.engine.requests[0]["messages"][-1]["content"]
    assert "[1] otters.md, lines 1-3:" in sent and "crayfish" in sent
    rig.answer(rid, "Fish and crayfish [1].")
    answer = rig.session.turns[-1]
    assert answer.content == "Fish and crayfish [1]." and answer.stats["final"] is True
    assert [Path(c["source"]).name for c in answer.stats["citations"]] == ["otters.md"]
    assert rig.session.turns[0].content == "What do otters eat?"  # the history keeps the user's words
    assert rig.writer.flush(10)
    saved = rig.history.messages(rig.session.conv.id)[1]
    assert saved.stats["citations"][0]["lines"] == [1, 3]
    assert rig.view.notices == []


def test_a_small_context_names_the_sources_left_out(rig, tmp_path):
    docs = tmp_path / "long"
    docs.mkdir()
    for i in range(5):
        (docs / f"part{i}.md").write_text(f"beavers dam {i} " + "lorem ipsum dolor " * 55, encoding="utf-8")
    coll = Collection.open("long", create=True)
    Indexer(coll).run([docs])
    rig.session.on_event(P.Loaded(id="l2", model="/m/model.gguf", chat_format="template", n_ctx=1700))
    rig.session.attach_docs(Attached(Retriever(coll)))
    rig.send("beavers dam")
    answer = rig.session.answer
    assert answer is not None and answer.stats["citations"] and answer.stats["sources_left_out"]
    level, text = rig.view.notices[-1]
    assert level == "warning" and "did not fit the model's context" in text


def test_a_broken_collection_answers_without_sources_and_says_so(rig, tmp_path):
    coll = collection(tmp_path)
    rig.session.attach_docs(Attached(Retriever(coll)))
    coll.close()  # its database is gone from under the session
    rid = rig.send("What do otters eat?")
    assert rig.engine.requests[0]["messages"][-1]["content"] == "What do otters eat?"
    assert "this answer has no sources" in rig.view.notices[-1][1]
    rig.answer(rid, "ok")


def test_the_watcher_reindexes_when_due_and_only_what_changed(tmp_path):
    from ggufdesk.session.docs_index import Watcher

    coll = collection(tmp_path)
    coll.close()
    now = [0.0]
    w = Watcher("wildlife", every_s=10, clock=lambda: now[0])
    first = w.poll()
    assert first is not None and first.touched == []  # nothing changed since docs add
    (tmp_path / "docs" / "herons.md").write_text("Herons also eat frogs.\n", encoding="utf-8")
    now[0] = 5.0
    assert w.poll() is None  # not due yet
    now[0] = 11.0
    report = w.poll()
    assert report is not None and [Path(p).name for p in report.touched] == ["herons.md"]
    with open_retriever("wildlife") as r:
        assert [Path(h.source).name for h in r.search("frogs", 5)] == ["herons.md"]
