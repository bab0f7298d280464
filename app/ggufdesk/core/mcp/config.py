"""mcp.json: the MCP servers ggufdesk may start, in the `mcpServers` shape Claude Desktop, Cursor,
LM Studio and Jan share; validated, saved atomically, a broken file kept aside (as settings.json is).

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                  "env": {"KEY": "value"}},
        "remote": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ..."}}}}

Per server, also: `cwd`, `type` ("stdio", "http"/"streamable-http", "sse"), `disabled` (true: never
offered), `alwaysAllow` (tools run without asking, as Cline and Roo Code write it) and `timeout`
(seconds a tool call may take). Unknown keys are kept as they are when the file is written back.
"""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from ggufdesk.core.aside import try_move_aside
from ggufdesk.core.atomic import write_atomic
from ggufdesk.core.errors import SettingsError

Transport = Literal["stdio", "http", "sse"]
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
MAX_SERVERS = 64
CALL_TIMEOUT_S = 300.0  # a tool call that takes longer is stopped (per server: "timeout")
_TYPES: dict[str, Transport] = {"stdio": "stdio", "http": "http", "streamable-http": "http",
                                "streamablehttp": "http", "streamable_http": "http", "sse": "sse"}
_KNOWN = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "disabled",
          "alwaysAllow", "timeout"}


class McpConfigError(SettingsError):
    """mcp.json (or one server in it) cannot be used; the message names the place."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """One MCP server: a command to start (stdio) or a URL to reach (streamable HTTP, SSE)."""

    name: str
    transport: Transport = "stdio"
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    disabled: bool = False
    always_allow: tuple[str, ...] = ()
    timeout: float = CALL_TIMEOUT_S
    extra: dict[str, Any] = field(default_factory=dict)  # keys we do not use, written back as they were

    def describe(self) -> str:
        """The command line or the URL, for lists and logs (header values left out)."""
        if self.transport == "stdio":
            return " ".join([self.command, *self.args])
        return f"{self.url} ({'SSE' if self.transport == 'sse' else 'HTTP'})"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.transport == "stdio":
            out["command"] = self.command
            if self.args:
                out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        else:
            out["url"] = self.url
            if self.transport == "sse":
                out["type"] = "sse"
            if self.headers:
                out["headers"] = dict(self.headers)
        if self.disabled:
            out["disabled"] = True
        if self.always_allow:
            out["alwaysAllow"] = list(self.always_allow)
        if self.timeout != CALL_TIMEOUT_S:
            out["timeout"] = self.timeout
        return out


@dataclass(frozen=True, slots=True)
class McpConfig:
    servers: dict[str, ServerConfig] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # other top-level keys (Claude Desktop's file has many)

    def enabled(self) -> list[ServerConfig]:
        return [s for s in self.servers.values() if not s.disabled]

    def with_server(self, server: ServerConfig, *, replacing: str | None = None) -> McpConfig:
        """A copy with `server` added, or put in the place of `replacing` (a rename keeps the order)."""
        if server.name in self.servers and server.name != replacing:
            raise McpConfigError(f"a server named {server.name!r} exists already")
        servers: dict[str, ServerConfig] = {}
        for name, s in self.servers.items():
            servers[server.name if name == replacing else name] = server if name == replacing else s
        servers.setdefault(server.name, server)
        return replace(self, servers=servers)

    def without(self, name: str) -> McpConfig:
        return replace(self, servers={k: v for k, v in self.servers.items() if k != name})

    def allowing(self, server: str, tool: str) -> McpConfig:
        """A copy where `tool` of `server` runs without asking ("Always for this tool")."""
        s = self.servers.get(server)
        if s is None or tool in s.always_allow:
            return self
        return self.with_server(replace(s, always_allow=(*s.always_allow, tool)), replacing=server)

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "mcpServers": {name: s.to_json() for name, s in self.servers.items()}}


def _strings(where: str, value: Any, *, kind: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise McpConfigError(f"{where} must be an object of {kind} names to text values")
    return dict(value)


def _text(where: str, value: Any, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()) or "\0" in value:
        raise McpConfigError(f"{where} must be {'a non-empty' if required else 'a'} text")
    return value


def _transport(where: str, entry: dict[str, Any]) -> Transport:
    kind = entry.get("type", entry.get("transport"))
    if kind is None:
        return "http" if "url" in entry and "command" not in entry else "stdio"
    if not isinstance(kind, str) or kind.lower() not in _TYPES:
        raise McpConfigError(f"{where}.type must be stdio, http or sse; got {kind!r}")
    return _TYPES[kind.lower()]


def _url(where: str, value: Any) -> str:
    url = _text(f"{where}.url", value, required=True).strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise McpConfigError(f"{where}.url must be an http:// or https:// address; got {url!r}")
    return url


def parse_server(name: Any, entry: Any) -> ServerConfig:
    """One `mcpServers` entry; raises McpConfigError naming the server and the field."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise McpConfigError(f"mcpServers: the server name {name!r} must be 1-64 letters, digits, spaces, "
                             "_ . - (starting with a letter or digit)")
    where = f"mcpServers.{name}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where} must be an object with a command or a url")
    transport = _transport(where, entry)
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}.args must be a list of texts")
    timeout = entry.get("timeout", CALL_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 1 <= timeout <= 86400:
        raise McpConfigError(f"{where}.timeout must be a number of seconds from 1 to 86400; got {timeout!r}")
    allow = entry.get("alwaysAllow", [])
    if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
        raise McpConfigError(f"{where}.alwaysAllow must be a list of tool names")
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise McpConfigError(f"{where}.disabled must be true or false")
    common = ServerConfig(name=name, transport=transport, disabled=disabled,
                          always_allow=tuple(dict.fromkeys(allow)), timeout=float(timeout),
                          extra={k: v for k, v in entry.items() if k not in _KNOWN})
    if transport == "stdio":
        if "url" in entry and "command" not in entry:
            raise McpConfigError(f"{where}: a stdio server needs a command, not a url")
        return replace(common, command=_text(f"{where}.command", entry.get("command"), required=True),
                       args=tuple(args), env=_strings(f"{where}.env", entry.get("env"), kind="variable"),
                       cwd=_text(f"{where}.cwd", entry.get("cwd")))
    return replace(common, url=_url(where, entry.get("url")),
                   headers=_strings(f"{where}.headers", entry.get("headers"), kind="header"))


def parse_config(data: Any) -> McpConfig:
    """The whole file's JSON value; raises McpConfigError at the first problem."""
    if not isinstance(data, dict):
        raise McpConfigError("the file must hold a JSON object with an \"mcpServers\" object")
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise McpConfigError("\"mcpServers\" must be an object of server names to servers")
    if len(servers) > MAX_SERVERS:
        raise McpConfigError(f"at most {MAX_SERVERS} servers, got {len(servers)}")
    parsed = {name: parse_server(name, entry) for name, entry in servers.items()}
    return McpConfig(parsed, {k: v for k, v in data.items() if k != "mcpServers"})


def mcp_config_path() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("ggufdesk")) / "mcp.json"


def mcp_log_dir() -> Path:
    """Where each server's stderr is kept (mcp-<name>.log), for the window's log view."""
    from platformdirs import user_log_dir

    return Path(user_log_dir("ggufdesk")) / "mcp"


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise McpConfigError(f"cannot read {path}: {e}") from None


def load_mcp_config(path: Path) -> McpConfig:
    """Read a file strictly (a missing file: no servers); raises McpConfigError with the place."""
    if not path.exists():
        return McpConfig()
    try:
        return parse_config(_read(path))
    except McpConfigError as e:
        raise McpConfigError(f"{path}: {e}") from None


@dataclass(frozen=True, slots=True)
class McpConfigReport:
    """What open_mcp_config found: the servers to use and what the user must be told (None: nothing)."""

    config: McpConfig
    warning: str | None = None
    kept_as: Path | None = None


def _salvage(path: Path) -> tuple[McpConfig, list[str]]:
    """The servers of a parseable file that are still valid; the names of those dropped."""
    try:
        data = _read(path)
    except McpConfigError:
        return McpConfig(), []
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        return McpConfig(), []
    good: dict[str, ServerConfig] = {}
    dropped: list[str] = []
    for name, entry in list(data["mcpServers"].items())[:MAX_SERVERS]:
        try:
            good[name] = parse_server(name, entry)
        except McpConfigError:
            dropped.append(str(name))
    return McpConfig(good, {k: v for k, v in data.items() if k != "mcpServers"}), dropped


def open_mcp_config(path: Path | None = None) -> McpConfigReport:
    """The app's servers; never raises for a broken file and never loses one.

    A file with a problem is moved aside to ``mcp.json.broken-<time>`` (never overwritten or
    deleted); the servers that were fine are written back to mcp.json, and the warning says which
    were left out and where the original is.
    """
    path = path or mcp_config_path()
    try:
        return McpConfigReport(load_mcp_config(path))
    except McpConfigError as e:
        problem = str(e)
    salvaged, dropped = _salvage(path)
    kept = try_move_aside(path)
    rewritten = kept is not None and bool(salvaged.servers) and _rewrite(salvaged, path)
    message = (f"Your MCP servers file could not be used as it is ({problem}); "
               + (f"{', '.join(dropped)} left out" if dropped and salvaged.servers else "no MCP servers are used")
               + (f" and the file was kept as {kept}" if kept else " and it could not be moved aside either")
               + ("" if rewritten or not salvaged.servers else "; the servers that were fine are used this time only")
               + ".")
    return McpConfigReport(salvaged, message, kept)


def _rewrite(config: McpConfig, path: Path) -> bool:
    try:
        save_mcp_config(config, path)
    except OSError:
        return False
    return True


def save_mcp_config(config: McpConfig, path: Path | None = None) -> Path:
    """Write atomically (a crash mid-write never leaves a broken file); raises OSError."""
    path = path or mcp_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(config.to_json(), indent=2, ensure_ascii=False) + "\n")
    return path


# ---- importing another app's servers (offered in the window, never done silently) -------------


def import_sources(home: Path | None = None, appdata: str | None = None) -> list[tuple[str, Path]]:
    """(label, path) of the other apps' MCP files that exist on this machine."""
    home = home or Path.home()
    appdata = appdata if appdata is not None else os.environ.get("APPDATA", "")
    claude = [home / ".config" / "Claude" / "claude_desktop_config.json",
              home / "Library" / "Application Support" / "Claude" / "claude_desktop_config.json"]
    if appdata or sys.platform == "win32":
        claude.insert(0, Path(appdata or home) / "Claude" / "claude_desktop_config.json")
    candidates = [("LM Studio", home / ".lmstudio" / "mcp.json"),
                  ("LM Studio", home / ".cache" / "lm-studio" / "mcp.json"),
                  *(("Claude Desktop", p) for p in claude), ("Cursor", home / ".cursor" / "mcp.json")]
    return [(label, p) for label, p in candidates if p.is_file()]


@dataclass(frozen=True, slots=True)
class ImportResult:
    config: McpConfig
    added: list[str]
    skipped: list[str]  # names already present (kept as they are) or entries we cannot use, with why


def import_servers(config: McpConfig, path: Path) -> ImportResult:
    """`config` with the servers of another app's file added; existing names are never replaced."""
    data = _read(path)
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f"{path} has no \"mcpServers\" object")
    added: list[str] = []
    skipped: list[str] = []
    out = config
    for name, entry in servers.items():
        if name in out.servers:
            skipped.append(f"{name} (a server of that name exists)")
            continue
        try:
            out = out.with_server(parse_server(name, entry))
            added.append(name)
        except McpConfigError as e:
            skipped.append(f"{name} ({e})")
    return ImportResult(out, added, skipped)
