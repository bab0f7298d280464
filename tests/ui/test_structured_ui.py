"""The window's structured-output setting (validated as you type) and tool calls shown as blocks."""
from __future__ import annotations

import json

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.ui.conversation_dialog import ConversationDialog
from ggufdesk.ui.message_widget import MessageWidget

SCHEMA = json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def test_schema_field_is_validated_as_you_type(qtbot):
    dlg = ConversationDialog(system_prompt="", sampling=SamplingSettings(), mode="chat")
    qtbot.addWidget(dlg)
    assert dlg.structured_kind.currentText() == "Off" and not dlg.structured_text.isEnabled()
    dlg.structured_kind.setCurrentText("JSON schema")
    assert dlg.structured_text.isEnabled() and not dlg.structured_valid
    dlg.structured_text.setPlainText('{"type": "object", "patternProperties": {}}')
    assert not dlg.structured_valid and "patternProperties" in dlg.structured_status.text()
    dlg.accept()
    assert dlg.result() == 0 and "patternProperties" in dlg.error_label.text()  # refused, kept open
    dlg.structured_text.setPlainText(SCHEMA)
    assert dlg.structured_valid and "valid schema" in dlg.structured_status.text()
    assert dlg.sampling().structured == SCHEMA
    dlg.structured_kind.setCurrentText("Tools")
    assert not dlg.structured_valid  # a schema is not a list of tools
    dlg.structured_kind.setCurrentText("Any JSON object")
    assert dlg.sampling().structured == "json_object"


def test_the_dialog_shows_a_saved_setting(qtbot):
    tools = json.dumps([{"type": "function", "function": {"name": "now"}}])
    dlg = ConversationDialog(system_prompt="", sampling=SamplingSettings(structured=tools), mode="chat")
    qtbot.addWidget(dlg)
    assert dlg.structured_kind.currentText() == "Tools" and dlg.structured_valid
    assert "1 tool" in dlg.structured_status.text()


def test_tool_calls_are_a_readable_block_not_markup(qtbot):
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    w = MessageWidget(message_id=1, role="assistant", text='<tool_call>{"name": "get_weather"}</tool_call>',
                      stats={"tool_calls": [call], "content": "", "finish_reason": "tool_calls"})
    qtbot.addWidget(w)
    assert not w.tools.isHidden() and "Tool call: get_weather" in w.tools.text()
    assert "&quot;city&quot;: &quot;Oslo&quot;" in w.tools.text() or '"city": "Oslo"' in w.tools.text()
    assert "tool_call" not in w.body.toPlainText() and w.body.isHidden()
    assert "called a tool" in w.footer.text()
    plain = MessageWidget(message_id=2, role="assistant", text="just text", stats={})
    qtbot.addWidget(plain)
    assert plain.tools.isHidden() and "just text" in plain.body.toPlainText()


def test_tools_come_with_a_tool_choice(qtbot):
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather"}},
                        {"type": "function", "function": {"name": "now"}}])
    dlg = ConversationDialog(system_prompt="", sampling=SamplingSettings(), mode="chat")
    qtbot.addWidget(dlg)
    assert not dlg.tool_choice.isEnabled()  # no tools: nothing to choose
    dlg.structured_kind.setCurrentText("Tools")
    dlg.structured_text.setPlainText(tools)
    assert dlg.tool_choice.isEnabled()
    assert [dlg.tool_choice.itemData(i) for i in range(dlg.tool_choice.count())] == [
        "auto", "required", "none", "get_weather", "now"]
    dlg.tool_choice.setCurrentIndex(dlg.tool_choice.findData("now"))
    s = dlg.sampling()
    assert s.tool_choice == "now"
    again = ConversationDialog(system_prompt="", sampling=s, mode="chat")  # shown as saved
    qtbot.addWidget(again)
    assert again.chosen_tool() == "now" and again.tool_choice.currentText() == "it must call now"


def test_a_tool_choice_reaches_the_request():
    from ggufdesk.core.errors import SettingsError
    from ggufdesk.core.tools import request_fields

    tools = json.dumps([{"type": "function", "function": {"name": "now"}}])
    assert request_fields(tools, "required")["tool_choice"] == "required"
    assert request_fields(tools, "now")["tool_choice"] == {"type": "function", "function": {"name": "now"}}
    import pytest

    with pytest.raises(SettingsError, match="not among the tools"):
        SamplingSettings(structured=tools, tool_choice="get_weather")
