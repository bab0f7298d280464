"""Settings refuse what cannot work, with messages that say why, and survive a round trip."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import (LoadSettings, SamplingSettings, Settings, SpeculationSettings,
                                    load_settings, open_settings, save_settings)


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
    path.write_text(json.dumps({"load": {"n_ctx": 0}}))
    with pytest.raises(SettingsError, match="context length"):
        load_settings(path)
    assert load_settings(tmp_path / "missing.json") == Settings()


def _user_settings(path):
    data = {"load": {"n_ctx": 8192}, "sampling": {"temperature": 0.3},
            "system_prompt": "You are terse.", "model": "/models/m.gguf"}
    path.write_text(json.dumps(data, indent=2))
    return data


def test_typo_keeps_the_file_and_tells_the_user(tmp_path):
    """A trailing double comma used to reset everything and the next load overwrote the file."""
    path = tmp_path / "settings.json"
    _user_settings(path)
    broken = path.read_text().replace('"temperature": 0.3', '"temperature": 0.3,,')
    path.write_text(broken)
    report = open_settings(path)
    assert report.settings == Settings()
    assert report.kept_as is not None and report.kept_as.name.startswith("settings.json.broken-")
    assert report.kept_as.read_text() == broken  # the user's text, byte for byte
    assert "could not be used" in report.warning and str(report.kept_as) in report.warning
    save_settings(report.settings, path)  # the app saves after the next model load...
    assert report.kept_as.read_text() == broken  # ...and the broken copy is still there
    again = open_settings(path)
    assert again.warning is None


def test_one_bad_value_resets_only_its_section(tmp_path):
    path = tmp_path / "settings.json"
    data = _user_settings(path)
    data["sampling"]["temperature"] = 99
    path.write_text(json.dumps(data))
    report = open_settings(path)
    assert report.settings.load.n_ctx == 8192 and report.settings.system_prompt == "You are terse."
    assert report.settings.model == "/models/m.gguf"
    assert report.settings.sampling == SamplingSettings()
    assert "sampling settings reset to defaults" in report.warning
    assert json.loads(report.kept_as.read_text())["sampling"]["temperature"] == 99


def test_unknown_keys_are_kept_and_written_back(tmp_path):
    path = tmp_path / "settings.json"
    data = _user_settings(path)
    data["theme"] = {"dark": True}
    data["load"]["future_option"] = 7
    path.write_text(json.dumps(data))
    report = open_settings(path)
    assert report.warning is None and report.settings.load.n_ctx == 8192
    report.settings.load.n_ctx = 2048  # the app changes something and saves
    save_settings(report.settings, path)
    saved = json.loads(path.read_text())
    assert saved["theme"] == {"dark": True} and saved["load"]["future_option"] == 7
    assert saved["load"]["n_ctx"] == 2048 and saved["system_prompt"] == "You are terse."


def test_not_an_object_and_unreadable(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("[1, 2]")
    report = open_settings(path)
    assert report.settings == Settings() and report.kept_as.exists() and not path.exists()
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert open_settings(path).kept_as.read_bytes() == b"\xff\xfe\x00garbage"
