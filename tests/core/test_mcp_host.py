"""The MCP host against a real test server (the mcp SDK's MCPServer) over stdio and streamable HTTP:
tools listed and called, and every way a server can fail contained and explained."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from ggufdesk.core.mcp.config import parse_config
from ggufdesk.core.mcp.host import McpFailure, McpHost
from tests.fixtures.mcp_servers import http_server, stdio_entry

WAIT = 60  # generous: a busy machine starts Python slowly; only a real hang runs into it


def host_for(tmp_path, servers: dict, **kw) -> McpHost:
    return McpHost(parse_config({"mcpServers": servers}), log_dir=tmp_path / "logs", **kw)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One stdio test server for the tests that do not break it."""
    h = host_for(tmp_path_factory.mktemp("mcp"), {"t": stdio_entry(), "odd": stdio_entry("garbage", "badbytes")})
    yield h
    h.close()


def test_nothing_starts_before_first_use(tmp_path):
    h = host_for(tmp_path, {"t": stdio_entry()})
    assert not h.started and h.status("t").state == "stopped"
    h.close()
    code = ("import sys, ggufdesk.core.mcp.host, ggufdesk.core.mcp.config, ggufdesk.session.tool_loop;"
            "print('mcp' in sys.modules, 'anyio' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=WAIT)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_list_and_call_over_stdio(shared):
    listing = shared.list_tools(["t"]).result(WAIT)
    names = [t.name for t in listing["t"]]
    assert {"echo", "add", "slow", "fail", "big", "strict"} <= set(names)
    add = next(t for t in listing["t"] if t.name == "add")
    assert add.description == "Add two whole numbers." and add.input_schema["required"] == ["a", "b"]
    assert shared.call("t", "add", {"a": 2, "b": 3}).result(WAIT).text == "5"
    assert shared.call("t", "echo", {"text": "héllo"}).result(WAIT).text == "héllo"
    status = shared.status("t")
    assert status.state == "ready" and [c.outcome for c in status.calls][-2:] == ["ok", "ok"]


def test_tool_errors_and_large_results(shared):
    failed = shared.call("t", "fail", {}).result(WAIT)
    assert failed.is_error and "fail" in failed.text
    big = shared.call("t", "big", {}).result(WAIT)
    assert len(big.text) == 1 << 20  # the host passes it whole; the session cuts it for the model
    unknown = shared.call("t", "nope", {}).result(WAIT)
    assert unknown.is_error and "nope" in unknown.text
    pic = shared.call("t", "picture", {}).result(WAIT)
    assert pic.media == 1 and "here is a picture" in pic.text and "image (image/png" in pic.text
    with pytest.raises(McpFailure, match="no MCP server named 'zz'"):
        shared.call("zz", "add", {}).result(WAIT)


def test_a_slow_call_can_be_stopped_and_times_out(shared):
    future = shared.call("t", "slow", {"seconds": 60})
    time.sleep(0.5)
    future.cancel()
    assert future.cancelled()
    with pytest.raises(McpFailure, match="did not answer within 1 s"):
        shared.call("t", "slow", {"seconds": 30}, timeout=1).result(WAIT)
    assert shared.call("t", "add", {"a": 1, "b": 1}).result(WAIT).text == "2"  # the server goes on
    outcomes = [c.outcome for c in shared.status("t").calls]
    assert "cancelled" in outcomes and "failed" in outcomes


def test_garbage_on_stdout_and_invalid_utf8_are_survived(shared):
    assert shared.call("odd", "echo", {"text": "still here"}).result(WAIT).text == "still here"
    assert shared.status("odd").garbage_lines >= 1
    text = shared.call("odd", "odd_bytes", {}).result(WAIT).text
    assert text.startswith("before ") and text.endswith(" after") and "\ufffd" in text
    text.encode("utf-8")  # valid from here on


def test_a_server_that_crashes_at_start_or_is_missing(tmp_path):
    h = host_for(tmp_path, {"crash": stdio_entry("crash"), "gone": {"command": str(tmp_path / "no-such-server")},
                            "ok": stdio_entry()})
    try:
        listing = h.list_tools(["crash", "gone", "ok"]).result(WAIT)
        assert isinstance(listing["crash"], McpFailure) and listing["crash"].kind == "start"
        assert "could not start" in str(listing["crash"]) and "missing API key" in str(listing["crash"])
        assert "was not found" in str(listing["gone"])
        assert [t.name for t in listing["ok"]][:2] == ["echo", "add"]  # the others are not held up
        assert h.status("crash").state == "failed"
        again = h.list_tools(["crash"]).result(WAIT)["crash"]  # not started again on every answer
        assert isinstance(again, McpFailure) and h.status("crash").state == "failed"
        assert (tmp_path / "logs" / "mcp-crash.log").read_text().count("missing API key") == 1
    finally:
        h.close()


def test_a_server_that_hangs_at_initialize_is_stopped(tmp_path):
    h = host_for(tmp_path, {"hang": stdio_entry("hang")}, init_timeout=2)
    try:
        failure = h.list_tools(["hang"]).result(WAIT)["hang"]
        assert isinstance(failure, McpFailure) and failure.kind == "timeout"
        assert "did not answer initialize within 2 s" in str(failure)
        with pytest.raises(McpFailure):
            h.call("hang", "add", {"a": 1, "b": 2}).result(WAIT)
    finally:
        h.close()


def test_a_server_that_dies_mid_call_is_reported_and_restarted(tmp_path):
    h = host_for(tmp_path, {"t": stdio_entry()})
    try:
        with pytest.raises(McpFailure, match="stopped during the call to 'die'.*dying now") as info:
            h.call("t", "die", {}).result(WAIT)
        assert info.value.kind == "closed" and h.status("t").state in ("failed", "stopped")
        assert h.call("t", "add", {"a": 2, "b": 2}).result(WAIT).text == "4"  # started again on next use
    finally:
        h.close()


def test_each_server_runs_in_its_own_process_group_and_stops_with_the_host(tmp_path):
    h = host_for(tmp_path, {"a": stdio_entry(), "b": stdio_entry()})
    pids = []
    for name in ("a", "b"):
        pid, sid = map(int, h.call(name, "pid", {}).result(WAIT).text.split())
        assert sid == pid != os.getsid(0)  # a session (and process group) of its own
        pids.append(pid)
    h.close()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(Exception, match="closing"):
        h.call("a", "add", {"a": 1, "b": 1}).result(WAIT)


def test_env_reaches_a_stdio_server(tmp_path):
    h = host_for(tmp_path, {"t": stdio_entry(env={"GGUFDESK_TEST_VALUE": "42"})})
    try:
        assert h.call("t", "env", {"name": "GGUFDESK_TEST_VALUE"}).result(WAIT).text == "42"
    finally:
        h.close()


def test_streamable_http_with_headers(tmp_path):
    with http_server() as url:
        h = host_for(tmp_path, {"web": {"url": url, "headers": {"X-Test": "1"}}})
        try:
            listing = h.list_tools(["web"]).result(WAIT)
            assert "add" in [t.name for t in listing["web"]]
            assert h.call("web", "add", {"a": 20, "b": 22}).result(WAIT).text == "42"
            assert h.call("web", "fail", {}).result(WAIT).is_error
        finally:
            h.close()


def test_an_http_server_that_is_not_there(tmp_path):
    from tests.fixtures.mcp_servers import free_port

    h = host_for(tmp_path, {"web": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}, init_timeout=20)
    try:
        failure = h.list_tools(["web"]).result(WAIT)["web"]
        assert isinstance(failure, McpFailure) and "could not start" in str(failure)
    finally:
        h.close()


def test_a_changed_server_is_restarted_on_next_use(tmp_path):
    h = host_for(tmp_path, {"t": stdio_entry()})
    try:
        first = h.call("t", "pid", {}).result(WAIT).text
        h.update_config(h.config.allowing("t", "add"))  # only a permission: the same process
        assert h.call("t", "pid", {}).result(WAIT).text == first
        h.update_config(parse_config({"mcpServers": {"t": stdio_entry(env={"A": "1"})}}))
        assert h.call("t", "pid", {}).result(WAIT).text != first
    finally:
        h.close()
