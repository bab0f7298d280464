"""The batched engine's protocol and settings additions: logprobs, Status, n_parallel, prefill_chunk."""
from __future__ import annotations

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P


@pytest.mark.parametrize("msg", [
    P.Generate(id="r1", prompt="x", logprobs=3),
    P.Token(id="r", text="a", logprobs=[{"token": "a", "logprob": -0.5, "top": [{"token": "b", "logprob": -1.0}]}]),
    P.Status(running=2, queued=1, kv_cells_used=10, kv_cells_total=512, n_parallel=4, spec="paused"),
    P.Error(kind="overloaded", id="r", message="busy"),
])
def test_round_trip(msg):
    assert P.decode(P.encode(msg)) == msg


def test_old_messages_still_decode():
    """A client that knows nothing of logprobs is unaffected."""
    assert P.decode('{"type": "token", "id": "r", "text": "x"}').logprobs is None
    assert P.decode('{"type": "generate", "id": "r", "prompt": "x"}').logprobs == 0


@pytest.mark.parametrize("kwargs, words", [
    ({"n_parallel": 0}, "n_parallel"), ({"n_parallel": 257}, "n_parallel"),
    ({"n_parallel": "4"}, "whole number"), ({"prefill_chunk": -1}, "prefill_chunk"),
])
def test_load_settings_refused(kwargs, words):
    with pytest.raises(SettingsError, match=words):
        LoadSettings(**kwargs)


def test_defaults_serve_one_sequence():
    s = LoadSettings()
    assert s.n_parallel == 1 and s.prefill_chunk == 0  # 0: sized per step by engine/batching/chunking.py
