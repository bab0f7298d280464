"""A long conversation in the window goes on: what no longer fits is said in a quiet line above the answer,
and the conversation settings choose the policy."""
from __future__ import annotations

import re

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.ui.conversation_dialog import OVERFLOW_CHOICES, ConversationDialog
from ggufdesk.ui.message_widget import MessageWidget


def test_the_note_is_a_quiet_line_above_an_answer(qtbot):
    note = "3 earlier turns no longer fit the 4,096-token context"
    w = MessageWidget(message_id=1, role="assistant", text="an answer", stats={"context_note": note})
    qtbot.addWidget(w)
    assert not w.context.isHidden() and w.context.text() == note
    lay = w.layout()
    assert lay.indexOf(w.context) < lay.indexOf(w.body)  # above the answer
    w.set_stats({})
    assert w.context.isHidden()
    user = MessageWidget(message_id=2, role="user", text="hi", stats={"context_note": note})
    qtbot.addWidget(user)
    assert user.context.isHidden()


def test_the_conversation_settings_choose_the_policy(qtbot):
    dlg = ConversationDialog(system_prompt="", sampling=SamplingSettings(), mode="chat")
    qtbot.addWidget(dlg)
    assert dlg.overflow.currentData() == "rolling" and dlg.sampling().context_overflow == "rolling"
    assert [dlg.overflow.itemData(i) for i in range(dlg.overflow.count())] == list(OVERFLOW_CHOICES)
    dlg.overflow.setCurrentIndex(dlg.overflow.findData("shift"))
    assert dlg.sampling().context_overflow == "shift"
    again = ConversationDialog(system_prompt="", sampling=SamplingSettings(context_overflow="error"), mode="chat")
    qtbot.addWidget(again)
    assert again.overflow.currentData() == "error"


def test_the_conversation_settings_keep_what_they_do_not_show(qtbot):
    # think and the reasoning budget (a model's preset can set them) are not fields of the dialog:
    # pressing OK must not put them back to their defaults
    kept = SamplingSettings(think="off", reasoning_budget=128, repeat_last_n=32, stop=["END"])
    dlg = ConversationDialog(system_prompt="", sampling=kept, mode="chat")
    qtbot.addWidget(dlg)
    dlg.temperature.setValue(0.3)
    got = dlg.sampling()
    assert (got.think, got.reasoning_budget, got.repeat_last_n, got.stop) == ("off", 128, 32, ["END"])
    assert got.temperature == 0.3
    got.stop.append("x")
    assert kept.stop == ["END"]  # a copy, not the conversation's own list


def test_a_conversation_past_the_context_goes_on_and_says_what_it_dropped(qtbot, loaded_window):
    w = loaded_window
    long = "the cat sat on the mat " * 300  # 1,800 words: two fit the 4,096-token context, three do not
    for i in range(3):
        with qtbot.waitSignal(w.answer_finished, timeout=15000) as blocker:
            assert w.send(f"{i} {long}")
        assert blocker.args == ["done"]
    widget = w.chat.widget_for(w.session.turns[-1].key)
    assert widget is not None and not widget.context.isHidden()
    note = widget.context.text()
    assert re.fullmatch(r"\d earlier turns no longer fit the 4,096-token context", note), note
    first = w.chat.widget_for(w.session.turns[1].key)
    assert first.context.isHidden()  # the first answers had room
    assert w.writer.flush(10)
    assert w.history.messages(w.conv.id)[-1].stats["context_note"] == note  # read back with the answer
