"""A reasoning model's thinking through the session: kept apart from the answer, timed and counted,
saved with it, shown again when the conversation is reopened, and never sent back to the model."""
from __future__ import annotations

from ggufdesk.engine.link import protocol as P
from ggufdesk.session.turns import Turn


class ThinkingView:
    def __init__(self, inner) -> None:
        self.inner, self.thoughts = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def turn_thought(self, turn, piece) -> None:
        self.thoughts.append((piece, dict(turn.stats)))


def test_thinking_is_apart_timed_saved_and_never_sent_back(rig):
    view = rig.session.view = ThinkingView(rig.view)
    rid = rig.send("what is 2+2?")
    s = rig.session
    rig.now = 10.0
    s.on_event(P.Token(id=rid, text="Two and two", reasoning=True))
    rig.now = 12.5
    s.on_event(P.Token(id=rid, text=" make four.", reasoning=True))
    s.on_event(P.Stats(id=rid, n_gen=5))  # stats replace the figures, not the thinking
    rig.now = 14.0
    s.on_event(P.Token(id=rid, text="It is 4."))
    rig.now = 20.0
    s.on_event(P.Stats(id=rid, n_gen=9, final=True))
    s.on_event(P.Done(id=rid, finish_reason="stop", text="It is 4.", reasoning="Two and two make four.",
                      usage={"prompt_tokens": 5, "completion_tokens": 9, "reasoning_tokens": 6}))
    answer = s.turns[-1]
    assert (answer.content, answer.reasoning) == ("It is 4.", "Two and two make four.")
    assert answer.stats["reasoning_tokens"] == 6 and answer.stats["reasoning_s"] == 4.0  # until the answer began
    assert [p for p, _ in view.thoughts] == ["Two and two", " make four."]
    assert view.thoughts[-1][1]["reasoning_s"] == 2.5  # while streaming: the time so far
    rig.settle()
    saved = rig.history.messages(s.conv.id)[-1]
    assert saved.content == "It is 4." and saved.stats["reasoning"] == "Two and two make four."
    assert Turn.from_message(saved).reasoning == "Two and two make four."
    rid2 = rig.send("and 3+3?")
    sent = rig.engine.requests[-1]["messages"]
    assert {"role": "assistant", "content": "It is 4."} in sent
    assert not any("Two and two" in m["content"] for m in sent)
    rig.answer(rid2, "6")


def test_an_answer_cut_inside_its_thinking_keeps_it(rig):
    rid = rig.send("think hard")
    s = rig.session
    s.on_event(P.Token(id=rid, text="Hmm, long", reasoning=True))
    s.on_event(P.Done(id=rid, finish_reason="length", text="", reasoning="Hmm, long",
                      usage={"completion_tokens": 4, "reasoning_tokens": 4}))
    answer = s.turns[-1]
    assert (answer.content, answer.reasoning, answer.finish_reason) == ("", "Hmm, long", "length")
    rig.settle()
    assert rig.history.messages(s.conv.id)[-1].stats["reasoning"] == "Hmm, long"
