"""A message shows why it ended and how fast it was written, its versions, and base-model wording."""
from __future__ import annotations

from ggufdesk.ui.message_widget import MessageWidget, footer_text


def test_stop_reason_and_speed_under_an_answer(qtbot):
    w = MessageWidget(message_id=3, role="assistant", text="…",
                      stats={"finish_reason": "length", "n_gen": 512, "decode_tok_s": 41.83})
    qtbot.addWidget(w)
    assert w.footer.text() == "stopped at the token limit · 512 tokens · 41.8 tok/s"
    assert not w.footer.isHidden()
    w.set_stats({"finish_reason": "stop", "n_gen": 9, "decode_tok_s": 50.0, "model": "m.gguf"})
    assert w.footer.text() == "finished · 9 tokens · 50.0 tok/s · m.gguf"
    user = MessageWidget(message_id=2, role="user", text="hi", stats={"n_gen": 3})
    qtbot.addWidget(user)
    assert user.footer.isHidden()
    assert footer_text({}) == ""
    assert footer_text({"finish_reason": "context"}) == "stopped: the context is full"


def test_versions_step_back_and_forth(qtbot):
    w = MessageWidget(message_id=7, role="assistant", text="second try")
    qtbot.addWidget(w)
    assert w.prev_btn.isHidden() and w.next_btn.isHidden()  # one version: no arrows
    w.set_versions(2, 3)
    assert not w.prev_btn.isHidden() and w.version_label.text() == "2/3"
    with qtbot.waitSignal(w.version_requested) as blocker:
        w.prev_btn.click()
    assert blocker.args == [7, -1]
    with qtbot.waitSignal(w.version_requested) as blocker:
        w.next_btn.click()
    assert blocker.args == [7, 1]
    w.set_versions(3, 3)
    assert not w.next_btn.isEnabled() and w.prev_btn.isEnabled()
    w.set_actions_enabled(False)  # streaming elsewhere: no stepping
    assert not w.prev_btn.isEnabled()


def test_completion_mode_is_one_text_not_a_chat(qtbot):
    from ggufdesk.core.history import Message
    from ggufdesk.ui.chat_view import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.set_mode("completion")
    u = view.add(Message(id=1, conversation_id=1, role="user", content="Once upon", created=0))
    a = view.add(Message(id=2, conversation_id=1, role="assistant", content=" a time", created=0))
    assert "Your text" in u.header.text() and "Continued by the model" in a.header.text()
    assert "You<" not in u.header.text() and "Assistant" not in a.header.text()
    view.set_mode("chat")
    assert "You" in u.header.text() and "Assistant" in a.header.text()


def test_long_code_lines_wrap_instead_of_being_cut_off(qtbot):
    from ggufdesk.ui.message_widget import MessageWidget

    code = "```python\nprint(reverse_list([1, 2, 3, 4, 5]))  # [5, 4, 3, 2, 1] and a long comment\n```"
    w = MessageWidget(message_id=1, role="assistant", text=code)
    qtbot.addWidget(w)
    w.resize(300, 200)
    w.show()
    qtbot.waitExposed(w)
    doc = w.body.document()
    assert doc.idealWidth() <= w.body.viewport().width() + 1  # nothing runs past the right edge
    assert "[5, 4, 3, 2, 1]" in w.body.toPlainText()
