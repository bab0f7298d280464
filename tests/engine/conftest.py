"""Engine fixtures: a real engine process on the tiny model, shared per module to keep tests fast."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.client import EngineClient

TINY_LOAD = LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)


@pytest.fixture(scope="module")
def engine(tiny_model):
    """A started engine with the tiny model loaded (module scope: restart costs ~1 s)."""
    client = EngineClient(auto_restart=True)
    client.start()
    client.load(str(tiny_model), settings=TINY_LOAD)
    yield client
    client.shutdown()
