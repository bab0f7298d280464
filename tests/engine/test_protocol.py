"""The JSON-lines protocol round-trips every message and refuses anything else."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P


@pytest.mark.parametrize("msg", [
    P.Load(model="/m.gguf", settings=LoadSettings(n_ctx=128), draft=None),
    P.Generate(id="r1", messages=[{"role": "user", "content": "hé\n\"x\""}], sampling=SamplingSettings(seed=3)),
    P.Cancel(id="r1"), P.Unload(), P.Shutdown(), P.Ready(pid=1),
    P.Loaded(model="m", memory={"kv": 1}), P.Progress(id="r", phase="prefill", done=1, total=2),
    P.Token(id="r", text="\u00e9\U0001F600"), P.Stats(id="r", decode_tok_s=1.5, final=True),
    P.Done(id="r", finish_reason="stop"), P.Error(kind="load", message="x"), P.Log(level="info", text="t"),
])
def test_round_trip(msg):
    line = P.encode(msg)
    assert line.endswith("\n") and line.count("\n") == 1
    assert P.decode(line) == msg


@pytest.mark.parametrize("line", ["", "not json", "[]", '{"type": "nope"}', '{"type": "cancel"}',
                                  '{"type": "cancel", "id": "r", "extra": 1}'])
def test_bad_lines_are_refused(line):
    with pytest.raises(P.ProtocolError):
        P.decode(line)
