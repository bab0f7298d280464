"""One live `ggufdesk serve` on the tiny model, shared by the server tests."""
from __future__ import annotations

import pytest

from tests.server.serving import ServeProcess


@pytest.fixture(scope="package")
def served(tiny_model, tmp_path_factory):
    """`ggufdesk serve` on the tiny model: greedy by default, 4 at once, no key."""
    server = ServeProcess(tiny_model, "--ctx", "2048", "--parallel", "4", "--temperature", "0",
                          home=tmp_path_factory.mktemp("serve-home"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake_server():
    """An in-process server over the fake engine (tests/fixtures/fake_engine.py): fast, no llama.cpp."""
    from tests.server.serving import InProcess

    server = InProcess(env={"FAKE_ENGINE_TOKENS_PER_S": "0"})
    yield server
    server.close()


@pytest.fixture(scope="package")
def agent_fake_server():
    """The fake engine with the context an agent's recorded request needs (Claude Code, Codex: --ctx 32768)."""
    from tests.server.serving import InProcess

    server = InProcess(env={"FAKE_ENGINE_TOKENS_PER_S": "0"}, n_ctx=32768)
    yield server
    server.close()


SCRIPTED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="package")
def scripted(tmp_path_factory):
    """`ggufdesk serve` on a Hermes-format model that answers every prompt with one get_weather call
    (tests/fixtures/scripted.py), also listening on a second, Ollama-style port."""
    import socket

    from tests.fixtures.scripted import write_scripted

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = write_scripted(tmp_path_factory.mktemp("scripted-models") / "hermes-tools.gguf", "hermes", SCRIPTED_CALL)
    server = ServeProcess(model, "--ctx", "2048", "--temperature", "0", "--ollama-port", str(port),
                          home=tmp_path_factory.mktemp("scripted-home"))
    yield server
    server.stop()
