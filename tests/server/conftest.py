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
