"""Regenerate and edit keep earlier versions (no silent deletion); stop reasons, models and titles."""
from __future__ import annotations

import pytest

from ggufdesk.engine.link import protocol as P
from ggufdesk.session import Refused
from ggufdesk.session.prompt import title_from


def contents(rig) -> list[str]:
    return [t.content for t in rig.session.turns]


def test_regenerating_an_earlier_answer_keeps_the_later_turns(rig):
    rig.answer(rig.send("q1"), "a1")
    rig.answer(rig.send("q2"), "a2")
    s = rig.session
    s.regenerate(s.turns[1].key)
    rig.until(lambda: s.phase == "streaming")
    assert contents(rig) == ["q1", ""]
    assert s.turns[1].version == (2, 2)
    rig.answer(f"r{len(rig.engine.requests)}", "a1 again")
    assert rig.rows() == [("user", "q1", "done"), ("assistant", "a1 again", "done")]
    s.step_version(s.turns[1].key, -1)
    rig.until(lambda: contents(rig) == ["q1", "a1", "q2", "a2"])  # the later turns came back
    assert s.turns[1].version == (1, 2)
    s.step_version(s.turns[1].key, +1)
    rig.until(lambda: contents(rig) == ["q1", "a1 again"])
    assert s.turns[1].version == (2, 2)


def test_versions_survive_reopening(rig):
    rig.answer(rig.send("q"), "first")
    s = rig.session
    s.regenerate(s.turns[1].key)
    rig.until(lambda: s.phase == "streaming")
    rig.answer(f"r{len(rig.engine.requests)}", "second")
    rig.settle()
    conv = s.conv
    s.close_conversation()
    s.open(rig.history.get_conversation(conv.id), rig.history.messages(conv.id),
           rig.history.versions(conv.id))
    assert s.turns[1].version == (2, 2) and s.turns[1].content == "second"


def test_editing_keeps_the_old_message_and_answer_as_a_version(rig):
    rig.answer(rig.send("one"), "A1")
    s = rig.session
    s.edit(s.turns[0].key)
    rig.answer(rig.send("one, edited"), "A2")
    assert rig.rows() == [("user", "one, edited", "done"), ("assistant", "A2", "done")]
    assert s.turns[0].version == (2, 2)
    s.step_version(s.turns[0].key, -1)
    rig.until(lambda: contents(rig) == ["one", "A1"])


def test_only_answers_are_regenerated(rig):
    rig.answer(rig.send("q"), "a")
    with pytest.raises(Refused):
        rig.session.regenerate(rig.session.turns[0].key)


def test_stop_reason_and_model_are_kept_with_the_answer(rig):
    rig.answer(rig.send("q"), "cut", reason="length")
    s = rig.session
    assert s.turns[1].finish_reason == "length"
    assert rig.writer.flush(10)
    stored = rig.history.messages(s.conv.id)[1]
    assert stored.stats["finish_reason"] == "length" and stored.stats["model"] == "model.gguf"


def test_a_conversation_remembers_its_model(rig):
    rig.answer(rig.send("q"), "a")
    s = rig.session
    assert s.conv.model == "/m/model.gguf"
    s.on_event(P.Loaded(id="l2", model="/m/other.gguf", chat_format="template"))
    rig.answer(rig.send("q2"), "a2")
    rig.settle()
    assert rig.history.get_conversation(s.conv.id).model == "/m/other.gguf"
    assert rig.history.export_json(s.conv.id)["model"] == "/m/other.gguf"


def test_titles_are_plain_words_and_follow_an_edited_first_message(rig):
    rig.answer(rig.send("# **Paris** trip `plans`"), "ok")
    s = rig.session
    assert s.conv.title == "Paris trip plans"
    s.edit(s.turns[0].key)
    rig.answer(rig.send("Lisbon trip instead"), "ok")
    assert s.conv.title == "Lisbon trip instead"
    rig.settle()
    assert rig.history.get_conversation(s.conv.id).title == "Lisbon trip instead"
    s.update_conversation(title="My own title")
    s.edit(s.turns[0].key)
    rig.answer(rig.send("Porto"), "ok")
    assert s.conv.title == "My own title"  # a title the user chose is not overwritten


def test_plain_titles():
    assert title_from("Use `code` and [a link](http://x)") == "Use code and a link"
    assert title_from("```python\nprint(1)\n```") == "print(1)"
    assert title_from("snake_case_name stays") == "snake_case_name stays"
