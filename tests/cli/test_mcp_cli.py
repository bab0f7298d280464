"""`run` and `chat` with MCP tools: --mcp-config, --allow-tools, tool_rounds in `run --json`, and
the terminal's permission prompt. The engine is the fake one, scripted to call a tool."""
from __future__ import annotations

import functools
import io
import json
import sys
from pathlib import Path

import pytest

from ggufdesk.cli import build_parser, main
from ggufdesk.cli import chat as chat_cmd
from ggufdesk.core.mcp.config import mcp_config_path
from ggufdesk.engine.link import client as client_mod
from ggufdesk.session.tool_loop import DENIED_TEXT
from tests.fixtures.mcp_servers import stdio_entry

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "fake_engine.py"
ADD = '__call__ add {"a": 2, "b": 3}'


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_TOKENS_PER_S", "0")
    monkeypatch.setattr(client_mod, "EngineClient",
                        functools.partial(client_mod.EngineClient, command=[sys.executable, str(FAKE)]))


@pytest.fixture
def servers(tmp_path) -> Path:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"calc": stdio_entry()}}))
    return path


def run_json(capsys, *argv: str) -> tuple[int, dict, str]:
    rc = main(["run", *argv, "--json"])
    out = capsys.readouterr()
    return rc, json.loads(out.out), out.err


def test_run_calls_the_tool_with_allow_tools(capsys, tiny_chatml, servers):
    rc, out, _ = run_json(capsys, str(tiny_chatml), "--prompt", ADD, "--mcp-config", str(servers), "--allow-tools")
    assert rc == 0, out
    assert out["tool_rounds"] == [{"server": "calc", "tool": "add", "arguments": {"a": 2, "b": 3}, "result": "5",
                                   "state": "done"}]
    assert out["text"] == "Tool said: 5" and out["finish_reason"] == "stop" and out["tokens"] > 0


def test_run_without_allow_tools_refuses_and_tells_the_model(capsys, tiny_chatml, servers):
    rc, out, _ = run_json(capsys, str(tiny_chatml), "--prompt", ADD, "--mcp-config", str(servers))
    assert rc == 0
    (only,) = out["tool_rounds"]
    assert only["state"] == "denied" and only["result"] == DENIED_TEXT
    assert out["text"].startswith("Tool said: The user did not allow")


def test_run_without_mcp_flags_starts_nothing(capsys, tiny_chatml, servers):
    mcp_config_path().parent.mkdir(parents=True, exist_ok=True)
    mcp_config_path().write_text(servers.read_text())  # the app's mcp.json: not used by a plain run
    rc, out, _ = run_json(capsys, str(tiny_chatml), "--prompt", ADD, "--chat")
    assert rc == 0 and "tool_rounds" not in out and out["text"].startswith("Echo:")


def test_a_mcp_config_with_a_typo_is_an_error_and_is_left_alone(capsys, tiny_chatml, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mcpServers": {"calc": {"comand": "x"}}}))
    rc, out, _ = run_json(capsys, str(tiny_chatml), "--prompt", "x", "--mcp-config", str(bad))
    assert rc == 1 and "mcpServers.calc.command" in out["error"] and bad.exists()
    rc, out, _ = run_json(capsys, str(tiny_chatml), "--prompt", "x", "--mcp-config", str(tmp_path / "none.json"))
    assert rc == 1 and "does not exist" in out["error"]
    rc, out, _ = run_json(capsys, str(tiny_chatml), "--prompt", "x", "--allow-tools", "--json-object")
    assert rc == 1 and "cannot be combined" in out["error"]


def test_the_apps_broken_mcp_json_is_kept_aside_and_the_user_told(capsys, tiny_chatml):
    path = mcp_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    rc, out, err = run_json(capsys, str(tiny_chatml), "--prompt", "hi", "--allow-tools")
    assert rc == 0 and "tool_rounds" not in out  # no servers left: a plain run
    assert "could not be used" in err and "mcp.json.broken-" in err
    assert not path.exists() and list(path.parent.glob("mcp.json.broken-*"))


def chat(argv: list[str], lines: str) -> str:
    args = build_parser().parse_args(["chat", *argv, "--max-tokens", "40"])
    out = io.StringIO()
    assert chat_cmd.run(args, stdin=io.StringIO(lines), stdout=out) == 0
    return out.getvalue()


def test_chat_asks_before_each_call(tiny_chatml, servers):
    text = chat([str(tiny_chatml), "--mcp-config", str(servers)], f"{ADD}\nmaybe\ny\n{ADD}\nn\n/exit\n")
    assert "MCP servers calc offer their tools" in text
    assert text.count("wants to call the MCP tool calc/add {\"a\": 2, \"b\": 3}") == 2
    assert "Tool said: 5" in text and "Tool said: The user did not allow" in text
    assert text.count("Run it?") == 3  # "maybe" is asked again


def test_chat_always_is_remembered_in_the_file(tiny_chatml, servers):
    text = chat([str(tiny_chatml), "--mcp-config", str(servers)], f"{ADD}\na\n{ADD}\n/exit\n")
    assert text.count("Run it?") == 1 and text.count("Tool said: 5") == 2
    assert json.loads(servers.read_text())["mcpServers"]["calc"]["alwaysAllow"] == ["add"]


def test_chat_with_a_server_that_cannot_start_goes_on(tiny_chatml, tmp_path):
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"broken": stdio_entry("crash")}}))
    text = chat([str(tiny_chatml), "--mcp-config", str(path), "--allow-tools"], "hello\n/exit\n")
    assert "could not start" in text and "missing API key" in text and "Echo: hello" in text
