"""The tool loop through the real engine: a scripted Hermes-format model (tests/fixtures/scripted.py)
calls the MCP test server's `add`, the engine parses the call, the session runs it and renders the
result back through the model's template, until the round cap makes it answer without tools."""
from __future__ import annotations

import pytest

from ggufdesk.core.mcp.config import parse_config
from ggufdesk.core.mcp.host import McpHost
from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link.client import EngineClient
from ggufdesk.session import ChatSession, SessionView
from ggufdesk.session.inbox import Inbox
from ggufdesk.session.tool_loop import ToolLoop
from tests.fixtures.mcp_servers import stdio_entry
from tests.fixtures.scripted import write_scripted

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
LOAD = LoadSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)


class Prompts(SessionView):
    def __init__(self) -> None:
        self.n_prompt: list[int] = []
        self.notices: list[str] = []

    def turn_finished(self, turn) -> None:
        self.n_prompt.append(int(turn.stats.get("n_prompt", 0)))

    def notice(self, text, level="info") -> None:
        self.notices.append(text)


@pytest.fixture
def host(tmp_path):
    h = McpHost(parse_config({"mcpServers": {"calc": stdio_entry("only=add")}}), log_dir=tmp_path / "logs")
    yield h
    h.close()


def test_a_scripted_model_calls_add_and_reads_the_result(tmp_path, host):
    model = write_scripted(tmp_path / "hermes.gguf", "hermes", CALL)
    inbox, view = Inbox(), Prompts()
    with EngineClient(auto_restart=False) as client:
        loaded = client.load(str(model), settings=LOAD)
        session = ChatSession(engine=client, view=view, post=inbox.post,
                              tools=ToolLoop(host, allow_all=True, max_rounds=2))
        session.on_event(loaded)
        session.new_conversation(sampling=SamplingSettings(temperature=0.0, max_tokens=64))
        session.send("what is 2+3? use the tool")
        while session.busy:
            inbox.run_pending()
            ev = next(client.events(timeout=0.05), None)
            if ev is not None:
                session.on_event(ev)
    roles = [(t.role, t.content) for t in session.turns]
    assert roles[:3] == [("user", "what is 2+3? use the tool"), ("assistant", ""), ("tool", "5")]
    assert [c for r, c in roles if r == "tool"] == ["5", "5"]  # two rounds, then the cap
    first = session.turns[1]
    assert first.finish_reason == "tool_calls" and first.stats["tool_calls"][0]["function"]["name"] == "add"
    last = session.turns[-1]
    assert last.role == "assistant" and last.status == "done" and last.finish_reason == "stop"
    assert view.n_prompt[1] > view.n_prompt[0]  # the call and its result went back through the template
    assert any("asked for tools 2 times" in n for n in view.notices)
