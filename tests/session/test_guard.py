"""A base model answering in a chat: a turn ends at a blank line, and a loop is cut after its first copy."""
from __future__ import annotations

from ggufdesk.engine.link import protocol as P
from ggufdesk.session.guard import repeat_cut


def test_repeat_cut_finds_three_back_to_back_copies():
    text = "Hi, I'm a student. I'm a student. I'm a student."
    cut = repeat_cut(text)
    assert cut is not None and text[:cut] == "Hi, I'm a student."
    assert repeat_cut("Hi, I'm a student. I'm a student.") is None  # twice can be emphasis
    assert repeat_cut("ha ha ha ha ha ha") is None  # a short refrain is not a loop
    assert repeat_cut("line one\nline two\nline three\n") is None
    lines = "The cat sat.\n" * 3
    assert lines[:repeat_cut(lines)] == "The cat sat.\n"
    assert repeat_cut("x" * 5000 + "abcdefghijklm" * 3) is not None  # only the end is read


def base_model_chat(rig):
    s = rig.session
    s.on_event(P.Loaded(id="l2", model="/m/gemma-base.gguf", chat_format="completion"))
    s.new_conversation()
    s.update_conversation(mode="chat")  # chatting with a base model (the terminal chat's default)
    return s


def test_a_base_models_chat_turn_ends_at_a_blank_line(rig):
    base_model_chat(rig)
    rig.send("Hello")
    sampling = rig.engine.requests[0]["sampling"]
    assert sampling.stop == ["\n\n"] and rig.engine.requests[0]["messages"]
    rig.session.update_conversation(mode="completion")
    rig.answer("r1", "Hi.")
    rig.send("Once")
    assert rig.engine.requests[1]["sampling"].stop == []  # continuing a text: no such stop


def test_a_base_model_that_loops_is_stopped_after_the_first_copy(rig):
    s = base_model_chat(rig)
    rid = rig.send("Who are you?")
    for piece in ["Hi,", " I'm a student.", " I'm a student.", " I'm a student."]:
        s.on_event(P.Token(id=rid, text=piece))
    assert rig.engine.cancelled == [rid] and s.phase == "stopping"
    s.on_event(P.Token(id=rid, text=" I'm"))  # already on its way
    s.on_event(P.Done(id=rid, finish_reason="cancelled"))
    answer = s.turns[-1]
    assert answer.content == "Hi, I'm a student." and answer.status == "done"
    assert answer.finish_reason == "repeat"
    assert rig.rows()[-1] == ("assistant", "Hi, I'm a student.", "done")


def test_a_chat_tuned_model_is_left_alone(rig):
    s = rig.session  # the rig's model has a chat template
    rid = rig.send("Say it three times")
    rig.answer(rid, "Hello there! ", "Hello there! ", "Hello there! ")
    assert rig.engine.cancelled == [] and s.turns[-1].content == "Hello there! " * 3
    assert rig.engine.requests[0]["sampling"].stop == []


def test_the_terminal_chat_says_why_it_stopped():
    import io

    from ggufdesk.cli.chat import TerminalView
    from ggufdesk.session import Turn

    out = io.StringIO()
    TerminalView(out).turn_finished(Turn(role="assistant", content="x", finish_reason="repeat"))
    assert out.getvalue() == "\n[stopped: it began repeating itself]"
