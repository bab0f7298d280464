"""mcp.json: the shared mcpServers shape read, validated, written back; a broken file kept aside."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.mcp.config import (CALL_TIMEOUT_S, McpConfig, McpConfigError, import_servers, import_sources,
                                      load_mcp_config, mcp_config_path, open_mcp_config, parse_config,
                                      parse_server, save_mcp_config)

CLAUDE = {
    "globalShortcut": "Ctrl+Space",
    "mcpServers": {
        "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "github": {"command": "docker", "args": ["run", "-i", "ghcr.io/github/github-mcp-server"],
                   "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"}},
    },
}


def test_the_shared_shape_round_trips_with_unknown_keys_kept(tmp_path):
    data = {**CLAUDE, "mcpServers": {**CLAUDE["mcpServers"],
                                     "remote": {"url": "https://example.org/mcp", "headers": {"Authorization": "Bearer t"},
                                                "note": "mine"},
                                     "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"}}}
    cfg = parse_config(data)
    assert [s.transport for s in cfg.servers.values()] == ["stdio", "stdio", "http", "sse"]
    assert cfg.servers["github"].env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "x"}
    assert cfg.servers["remote"].extra == {"note": "mine"} and cfg.servers["remote"].timeout == CALL_TIMEOUT_S
    path = save_mcp_config(cfg, tmp_path / "mcp.json")
    assert json.loads(path.read_text()) == data  # nothing lost, nothing added
    assert load_mcp_config(path) == cfg


@pytest.mark.parametrize("entry, words", [
    ({"args": ["x"]}, "mcpServers.s.command must be a non-empty text"),
    ({"command": "x", "args": "a b"}, "mcpServers.s.args must be a list of texts"),
    ({"command": "x", "env": {"A": 1}}, "mcpServers.s.env must be an object of variable names"),
    ({"url": "ftp://h/x"}, "must be an http:// or https:// address"),
    ({"url": "http://h/x", "type": "websocket"}, "type must be stdio, http or sse"),
    ({"command": "x", "timeout": 0}, "timeout must be a number of seconds"),
    ({"command": "x", "alwaysAllow": "all"}, "alwaysAllow must be a list"),
    ({"command": "x", "disabled": "no"}, "disabled must be true or false"),
    ("npx server", "must be an object with a command or a url"),
])
def test_a_bad_entry_is_refused_with_its_place(entry, words):
    with pytest.raises(McpConfigError, match=words.replace(".", r"\.").replace("/", ".")):
        parse_server("s", entry)


def test_bad_names_and_shapes():
    with pytest.raises(McpConfigError, match="server name"):
        parse_config({"mcpServers": {"../evil": {"command": "x"}}})
    with pytest.raises(McpConfigError, match="must hold a JSON object"):
        parse_config([1, 2])
    with pytest.raises(McpConfigError, match="mcpServers"):
        parse_config({"mcpServers": ["x"]})
    assert parse_config({}) == McpConfig()


def test_the_file_lives_in_the_config_directory():
    assert mcp_config_path().name == "mcp.json" and mcp_config_path().parent.name == "ggufdesk"
    assert open_mcp_config().config == McpConfig() and open_mcp_config().warning is None  # none yet


def test_a_typo_keeps_the_file_aside_and_the_good_servers(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"good": {"command": "x"}, "typo": {"comand": "y"}}}))
    report = open_mcp_config(path)
    assert list(report.config.servers) == ["good"]
    assert report.kept_as is not None and report.kept_as.name.startswith("mcp.json.broken-")
    assert json.loads(report.kept_as.read_text())["mcpServers"]["typo"] == {"comand": "y"}  # nothing lost
    assert "typo left out" in report.warning and str(report.kept_as) in report.warning
    assert "mcpServers.typo.command" in report.warning
    assert list(load_mcp_config(path).servers) == ["good"]  # written back: the next start is clean


def test_a_file_that_is_not_json_is_kept_aside(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"a": {"command": "x",}}')
    report = open_mcp_config(path)
    assert report.config == McpConfig() and "no MCP servers are used" in report.warning
    assert report.kept_as.read_text().startswith('{"mcpServers"') and not path.exists()


def test_changes_keep_order_and_refuse_duplicates():
    cfg = parse_config(CLAUDE)
    renamed = cfg.with_server(parse_server("fs", CLAUDE["mcpServers"]["filesystem"]), replacing="filesystem")
    assert list(renamed.servers) == ["fs", "github"]
    with pytest.raises(McpConfigError, match="exists already"):
        cfg.with_server(parse_server("github", {"command": "y"}))
    allowed = cfg.allowing("github", "list_issues").allowing("github", "list_issues")
    assert allowed.servers["github"].always_allow == ("list_issues",)
    assert allowed.to_json()["mcpServers"]["github"]["alwaysAllow"] == ["list_issues"]
    assert list(cfg.without("github").servers) == ["filesystem"]


def test_import_from_other_apps_adds_but_never_replaces(tmp_path):
    home = tmp_path / "home"
    claude = home / ".config" / "Claude" / "claude_desktop_config.json"
    lms = home / ".lmstudio" / "mcp.json"
    for path, data in ((claude, CLAUDE), (lms, {"mcpServers": {"filesystem": {"command": "other"},
                                                               "broken": {"args": []}}})):
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(data))
    sources = import_sources(home, appdata="")
    assert [label for label, _ in sources] == ["LM Studio", "Claude Desktop"]
    first = import_servers(McpConfig(), claude)
    assert first.added == ["filesystem", "github"] and first.skipped == []
    second = import_servers(first.config, lms)
    assert second.added == [] and second.config.servers["filesystem"].command == "npx"
    assert second.skipped[0].startswith("filesystem (a server of that name exists)")
    assert "command" in second.skipped[1]
    with pytest.raises(McpConfigError, match="no \"mcpServers\""):
        (tmp_path / "x.json").write_text("{}")
        import_servers(McpConfig(), tmp_path / "x.json")
