"""Claude Code's and Codex's recorded requests through the real engine, on the starter (slow tier).

Their first requests crashed the engine once (a 4 MB tool grammar from Claude Code's Workflow tool) and
were refused once (max_tokens 32000 beside a 19k-token prompt): this replays them whole, as sent."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.server.serving import ServeProcess

# A hang guard, not a budget: the recorded Claude Code request is ~20k tokens of prompt, 147 s of prefill
# on a quiet 2-core machine (llama-cpp-python alone: 204 s), and over 300 s on a busy CI runner.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


@pytest.fixture(scope="module")
def starter(starter_model, tmp_path_factory):
    server = ServeProcess(starter_model, "--ctx", "32768", "--parallel", "2", "--temperature", "0",
                          home=tmp_path_factory.mktemp("starter-home"), timeout=300)
    yield server
    server.stop()


def test_claude_codes_main_request_is_answered(starter):
    body = {**json.loads((CLIENTS / "claude_code_2.1.197_main.json").read_text()), "max_tokens": 3}
    with httpx.stream("POST", starter.url + "/v1/messages?beta=true", json=body, timeout=3600) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["usage"]["input_tokens"] == events[0]["message"]["usage"]["input_tokens"] > 10_000
    assert delta["delta"]["stop_reason"] in ("max_tokens", "end_turn", "tool_use")


def test_codexs_request_is_answered(starter):
    body = {**json.loads((CLIENTS / "codex_0.171.0_exec.json").read_text()), "max_output_tokens": 3}
    with httpx.stream("POST", starter.url + "/v1/responses", json=body, timeout=3600) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert events[-1]["response"]["usage"]["input_tokens"] > 5_000
