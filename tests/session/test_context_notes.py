"""What the overflow policy dropped, told with the answer: a quiet line kept with it, also when read back."""
from __future__ import annotations

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.prompt import context_note


def test_a_new_conversation_rolls_by_default_and_sends_its_policy(rig):
    rig.send("hello")
    sampling = rig.engine.requests[-1]["sampling"]
    assert sampling.context_overflow == "rolling"
    rig.session.update_conversation(sampling=SamplingSettings(context_overflow="shift"))
    rig.answer("r1", "hi")
    rig.send("again")
    assert rig.engine.requests[-1]["sampling"].context_overflow == "shift"


def test_the_note_comes_with_the_answer_and_is_saved_with_it(rig):
    notes = []
    rig.view.context_noted = lambda turn: notes.append(turn.stats["context_note"])  # type: ignore[method-assign]
    rid = rig.send("hello")
    rig.session.on_event(P.Overflow(id=rid, policy="rolling", truncated_tokens=812, dropped_messages=3, n_ctx=4096))
    rig.answer(rid, "hi", " there")
    assert notes == ["3 earlier turns no longer fit the 4,096-token context"]
    rig.settle()
    conv = rig.session.conv
    stored = rig.history.messages(conv.id)[-1]
    assert stored.stats["context_note"] == notes[0]  # the Stats of the answer did not wash it out


def test_the_default_view_says_it_as_a_notice(rig):
    rid = rig.send("hello")
    rig.session.on_event(P.Overflow(id=rid, policy="shift", truncated_tokens=1200, n_ctx=2048))
    assert ("info", "the oldest 1,200 tokens were dropped as the answer filled the 2,048-token context") \
        in rig.view.notices


def test_an_overflow_of_another_request_is_not_ours(rig):
    rig.send("hello")
    rig.session.on_event(P.Overflow(id="other", policy="rolling", truncated_tokens=5, dropped_messages=1))
    assert rig.view.notices == [] and "context_note" not in rig.session.answer.stats


def test_notes_in_words():
    assert context_note(P.Overflow(id="r", policy="rolling", truncated_tokens=9, dropped_messages=1, n_ctx=256)) \
        == "1 earlier turn no longer fits the 256-token context"
    assert context_note(P.Overflow(id="r", policy="rolling", truncated_tokens=120, n_ctx=4096)) \
        == "the first 120 tokens no longer fit the 4,096-token context"
    assert context_note(P.Overflow(id="r", policy="truncate-middle", truncated_tokens=3000, n_ctx=4096)) \
        == "the middle of the conversation (3,000 tokens) was left out to fit the 4,096-token context"
    fallback = P.Overflow(id="r", policy="rolling", truncated_tokens=0, note="this model's context cannot shift")
    assert context_note(fallback) == "this model's context cannot shift"
