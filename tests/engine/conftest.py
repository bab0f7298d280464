"""Engine fixtures: a real engine process on the tiny model, shared per module to keep tests fast."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link.client import EngineClient

@pytest.fixture(autouse=True)
def _data_ceiling_restored():
    """An Engine loading in this process (engine/runtime/memlimit.py) sets the test process's own RLIMIT_DATA,
    sized for the tiny model: put it back, or a later test loading a bigger model fails to allocate."""
    import resource

    before = resource.getrlimit(resource.RLIMIT_DATA)
    yield
    resource.setrlimit(resource.RLIMIT_DATA, before)


TINY_LOAD = LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)


@pytest.fixture(scope="module")
def engine(tiny_model):
    """A started engine with the tiny model loaded (module scope: restart costs ~1 s)."""
    client = EngineClient(auto_restart=True)
    client.start()
    client.load(str(tiny_model), settings=TINY_LOAD)
    yield client
    client.shutdown()


@pytest.fixture(scope="module")
def client():
    """A started engine with no model: the test loads its own (the scripted models of tests/fixtures/scripted.py)."""
    c = EngineClient(auto_restart=True)
    c.start()
    yield c
    c.shutdown()
