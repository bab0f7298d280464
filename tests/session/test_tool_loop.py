"""The session's MCP tool loop: a scripted engine asks for calls, a real MCP test server answers,
and the conversation (and its saved history) holds every step."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.mcp.config import load_mcp_config, parse_config
from ggufdesk.core.mcp.host import McpHost
from ggufdesk.engine.link import protocol as P
from ggufdesk.session import ChatSession
from ggufdesk.session.tool_loop import DENIED_TEXT, STOPPED_TEXT, ToolLoop
from tests.fixtures.mcp_servers import stdio_entry
from tests.session.conftest import RecordingView, Rig

WAIT = 60.0


class ToolView(RecordingView):
    def __init__(self) -> None:
        super().__init__()
        self.cards: list[tuple[str, str, str]] = []  # (tool, state, result)
        self.asked: list = []
        self.changed: list[str] = []

    def tool_call_changed(self, call) -> None:
        self.cards.append((call.tool, call.state, call.result))
        if call.state == "asking":
            self.asked.append(call)

    def turn_changed(self, turn) -> None:
        self.changed.append(turn.content)


class ToolRig(Rig):
    def __init__(self, history, writer, loop: ToolLoop) -> None:
        super().__init__(history, writer)
        self.view = ToolView()
        self.loop = loop
        self.session = ChatSession(engine=self.engine, writer=writer, view=self.view, post=self.inbox.post,
                                   clock=lambda: self.now, tools=loop)
        self.session.on_event(P.Loaded(id="l1", model="/m/model.gguf", chat_format="template", n_ctx=4096))

    def wait_request(self, n: int) -> dict:
        self.until(lambda: len(self.engine.requests) >= n, WAIT)
        return self.engine.requests[n - 1]

    def call(self, rid: str, name: str, args: dict, *, text: str = "") -> None:
        """The engine's answer is a call (streamed as the model writes it, then parsed)."""
        raw = f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'
        for piece in (text, raw[:11], raw[11:]):
            if piece:
                self.session.on_event(P.Token(id=rid, text=piece))
        calls = [{"id": f"call_{rid}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]
        self.session.on_event(P.Done(id=rid, finish_reason="tool_calls", text=text + raw, tool_calls=calls,
                                     content=text))

    def asked_about(self, n: int):
        self.until(lambda: len(self.view.asked) >= n, WAIT)
        return self.view.asked[n - 1]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    h = McpHost(parse_config({"mcpServers": {"test": stdio_entry(), "other": stdio_entry("name=other")}}),
                log_dir=tmp_path_factory.mktemp("mcp-logs"))
    yield h
    h.close()


@pytest.fixture
def trig(history, writer, host, tmp_path):
    saved = tmp_path / "mcp.json"
    host.update_config(parse_config({"mcpServers": {"test": stdio_entry(), "other": stdio_entry("name=other")}}))
    loop = ToolLoop(host, save_config=lambda cfg: __import__("ggufdesk.core.mcp.config", fromlist=["x"])
                    .save_mcp_config(cfg, saved))
    rig = ToolRig(history, writer, loop)
    rig.saved = saved
    return rig


def test_offer_call_allow_once_and_answer(trig):
    s = trig.session
    s.send("what is 2+3? use the tool")
    req = trig.wait_request(1)
    names = [t["function"]["name"] for t in req["tools"]]
    assert req["tool_choice"] == "auto" and "test__add" in names and "other__add" in names  # same names: prefixed
    assert "strict" not in names and "test__strict" in names
    assert req["tools_without_grammar"] == ["test__strict", "other__strict"]
    warnings = [t for lvl, t in trig.view.notices if lvl == "warning"]
    assert sum("uniqueItems" in t for t in warnings) == 2  # said once per tool, not per answer
    trig.call("r1", "test__add", {"a": 2, "b": 3}, text="Let me add. ")
    # the call text is held back, and the space before it too: what streamed is already the final text
    assert s.turns[-1].content == "Let me add." and trig.view.changed == []
    card = trig.asked_about(1)
    assert (card.server, card.tool, card.arguments) == ("test", "add", {"a": 2, "b": 3}) and s.phase == "tool"
    s.decide(card.key, "once")
    req2 = trig.wait_request(2)
    tail = req2["messages"][-2:]
    assert tail[0]["role"] == "assistant" and tail[0]["tool_calls"][0]["function"]["name"] == "test__add"
    assert tail[1] == {"role": "tool", "tool_call_id": "call_r1", "name": "test__add", "content": "5"}
    trig.answer("r2", "2 + 3 = 5.")
    assert s.phase == "idle"
    assert [(r, c) for r, c, _ in trig.rows()] == [
        ("user", "what is 2+3? use the tool"), ("assistant", "Let me add."), ("tool", "5"), ("assistant", "2 + 3 = 5.")]
    msgs = trig.history.messages(s.conv.id)
    assert msgs[2].stats["server"] == "test" and msgs[2].stats["tool"] == "add" and msgs[2].stats["state"] == "done"
    assert [c.tool for c in trig.view.asked] == ["add"]
    assert trig.history.list_conversations("5")  # results are searchable
    md = trig.history.export_markdown(s.conv.id)
    assert "**Tool result (test/add):**" in md and "_Calls the tool test__add" in md


def test_deny_tells_the_model_and_always_is_remembered(trig):
    s = trig.session
    s.send("add things")
    trig.wait_request(1)
    trig.call("r1", "test__add", {"a": 1, "b": 1})
    s.decide(trig.asked_about(1).key, "deny")
    req = trig.wait_request(2)
    assert req["messages"][-1] == {"role": "tool", "tool_call_id": "call_r1", "name": "test__add",
                                   "content": DENIED_TEXT}
    trig.call("r2", "test__echo", {"text": "hi"})
    s.decide(trig.asked_about(2).key, "always")
    trig.wait_request(3)
    assert load_mcp_config(trig.saved).servers["test"].always_allow == ("echo",)
    trig.call("r3", "test__echo", {"text": "again"})  # not asked a second time
    req4 = trig.wait_request(4)
    assert req4["messages"][-1]["content"] == "again" and len(trig.view.asked) == 2
    trig.answer("r4", "done")
    assert [c for _, c, _ in trig.rows()].count(DENIED_TEXT) == 1


def test_errors_and_large_results_go_back_to_the_model(trig):
    trig.loop.allow_all = True
    s = trig.session
    s.send("break it")
    trig.wait_request(1)
    trig.call("r1", "test__fail", {})
    assert trig.wait_request(2)["messages"][-1]["content"].startswith("Error: ")
    trig.call("r2", "test__big", {})
    big = trig.wait_request(3)["messages"][-1]["content"]
    assert len(big) < 9000 and "result truncated: 1,048,576 characters, the first 8,192 are shown" in big
    trig.call("r3", "nosuch", {})  # a name nobody offered
    assert "no tool named 'nosuch'" in trig.wait_request(4)["messages"][-1]["content"]
    trig.answer("r4", "ok")
    truncated = [m for m in trig.history.messages(s.conv.id) if m.stats.get("truncated")]
    assert len(truncated) == 1 and len(truncated[0].content) < 9000


def test_stop_stops_a_running_tool_and_the_conversation_goes_on(trig):
    trig.loop.allow_all = True
    s = trig.session
    s.send("wait")
    trig.wait_request(1)
    trig.call("r1", "test__slow", {"seconds": 60})
    trig.until(lambda: ("slow", "running", "") in trig.view.cards, WAIT)
    s.stop()
    assert s.phase == "idle" and s.turns[-1].role == "tool" and s.turns[-1].content == STOPPED_TEXT
    trig.until(lambda: any(c.outcome == "cancelled" for c in trig.loop.host.status("test").calls), WAIT)
    s.send("and now?")  # the conversation goes on
    req = trig.wait_request(2)
    assert [m["role"] for m in req["messages"]][-3:] == ["assistant", "tool", "user"]
    trig.answer("r2", "fine")


def test_stop_while_asking_never_runs_the_call(trig):
    s = trig.session
    s.send("x")
    trig.wait_request(1)
    trig.call("r1", "test__add", {"a": 1, "b": 2})
    card = trig.asked_about(1)
    with pytest.raises(Exception, match="a tool call is waiting"):
        s.send("another")
    s.stop()
    s.decide(card.key, "once")  # too late: nothing runs
    trig.inbox.run_pending()
    assert s.phase == "idle" and card.state == "stopped" and len(trig.engine.requests) == 1


def test_the_round_cap_makes_the_model_answer(trig):
    trig.loop.allow_all = True
    trig.loop.max_rounds = 2
    s = trig.session
    s.send("loop")
    for n in (1, 2):
        assert trig.wait_request(n)["tool_choice"] == "auto"
        trig.call(f"r{n}", "test__add", {"a": n, "b": 0})
    last = trig.wait_request(3)
    assert last["tool_choice"] == "none"
    assert any("asked for tools 2 times" in t for _, t in trig.view.notices)
    trig.answer("r3", "enough")
    assert s.phase == "idle"


def test_a_conversation_can_turn_servers_off(trig):
    s = trig.session
    s.new_conversation(mcp_off=("test", "other"))
    s.send("no tools here")
    req = trig.wait_request(1)
    assert "tools" not in req
    trig.answer("r1", "fine")
    trig.settle()
    assert trig.history.get_conversation(s.conv.id).mcp_off == ("test", "other")
    s.update_conversation(mcp_off=("other",))
    s.send("now")
    assert [t["function"]["name"] for t in trig.wait_request(2)["tools"]][0] == "echo"  # unique again: no prefix


def test_a_server_that_cannot_start_is_said_once_and_others_still_work(history, writer, tmp_path):
    host = McpHost(parse_config({"mcpServers": {"crash": stdio_entry("crash"), "t": stdio_entry()}}),
                   log_dir=tmp_path / "logs")
    try:
        rig = ToolRig(history, writer, ToolLoop(host, allow_all=True))
        s = rig.session
        s.send("hi")
        req = rig.wait_request(1)
        assert "echo" in [t["function"]["name"] for t in req["tools"]]
        said = [t for lvl, t in rig.view.notices if "'crash'" in t]
        assert len(said) == 1 and "could not start" in said[0] and "not offered" in said[0]
        assert ("info", "starting MCP servers crash, t…") in rig.view.notices
        rig.answer("r1", "hello")
        s.send("again")
        rig.wait_request(2)
        assert len([t for lvl, t in rig.view.notices if "crash" in t]) == 2  # nothing new: not tried again
        rig.call("r2", "die", {})
        req3 = rig.wait_request(3)
        assert "stopped during the call" in req3["messages"][-1]["content"]
        assert any("stopped during the call" in t for lvl, t in rig.view.notices if lvl == "warning")
        rig.answer("r3", "the server died")
        assert s.phase == "idle"
    finally:
        host.close()


def test_a_streamable_http_server_through_the_loop(history, writer, tmp_path):
    from tests.fixtures.mcp_servers import http_server

    with http_server("only=add") as url:
        host = McpHost(parse_config({"mcpServers": {"web": {"url": url}}}), log_dir=tmp_path / "logs")
        try:
            rig = ToolRig(history, writer, ToolLoop(host))
            s = rig.session
            s.send("add over http")
            assert [t["function"]["name"] for t in rig.wait_request(1)["tools"]] == ["add"]
            rig.call("r1", "add", {"a": 40, "b": 2})
            s.decide(rig.asked_about(1).key, "once")
            assert rig.wait_request(2)["messages"][-1]["content"] == "42"
            rig.answer("r2", "42")
        finally:
            host.close()
