"""Settings refuse what cannot work, with messages that say why, and survive a round trip."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import (LoadSettings, SamplingSettings, Settings, SpeculationSettings,
                                    load_settings, save_settings)


@pytest.mark.parametrize("kwargs, words", [
    ({"n_ubatch": 1024, "n_batch": 512}, "micro-batch"),
    ({"type_v": "q8_0", "flash_attn": "off"}, "flash attention"),
    ({"n_ctx": 0}, "context length"),
    ({"n_ctx": "4096"}, "whole number"),
    ({"n_threads": -2}, "at least 0"),
    ({"type_k": "q3_banana"}, "one of"),
    ({"n_gpu_layers": -5}, "GPU layers"),
])
def test_load_settings_refused(kwargs, words):
    with pytest.raises(SettingsError, match=words):
        LoadSettings(**kwargs)


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_p": 2}, {"max_tokens": 0},
                                    {"temperature": float("nan")}, {"stop": [""]}, {"seed": True}])
def test_sampling_refused(kwargs):
    with pytest.raises(SettingsError):
        SamplingSettings(**kwargs)


def test_speculation_needs_a_draft_and_sane_k():
    with pytest.raises(SettingsError, match="draft model"):
        SpeculationSettings(mode="draft")
    with pytest.raises(SettingsError, match="K min"):
        SpeculationSettings(k_min=5, k_max=2)


def test_quantized_v_cache_with_flash_attention_auto_is_allowed():
    assert LoadSettings(type_k="q8_0", type_v="q8_0").type_v == "q8_0"


def test_round_trip_and_broken_files(tmp_path):
    s = Settings(load=LoadSettings(n_ctx=8192), sampling=SamplingSettings(stop=["x"]))
    path = save_settings(s, tmp_path / "s.json")
    assert load_settings(path) == s
    path.write_text("{ nope")
    with pytest.raises(SettingsError, match="cannot read"):
        load_settings(path)
    path.write_text(json.dumps({"load": {"n_ctx": 8192, "bogus": 1}}))
    with pytest.raises(SettingsError, match="bogus"):
        load_settings(path)
    assert load_settings(tmp_path / "missing.json") == Settings()
