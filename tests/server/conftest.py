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
