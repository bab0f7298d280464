"""Per-model presets: a settings-file section keyed by library id, over the defaults, checked at the edge."""
from __future__ import annotations

import json

import pytest

from ggufdesk.core.errors import SettingsError
from ggufdesk.core.settings import Preset, Settings, open_settings, save_settings


def test_a_preset_overrides_only_what_it_names():
    s = Settings()
    s.system_prompt = "default prompt"
    s.set_preset("tiny", Preset(load={"n_ctx": 1024, "type_k": "q8_0"}, sampling={"temperature": 0.2},
                                speculation={"mode": "lookup"}, system_prompt="be brief"))
    m = s.for_model("tiny")
    assert (m.load.n_ctx, m.load.type_k, m.load.n_batch) == (1024, "q8_0", 512)
    assert m.sampling.temperature == 0.2 and m.sampling.top_k == 40 and m.speculation.mode == "lookup"
    assert m.system_prompt == "be brief"
    assert s.for_model("other") is s and s.for_model(None) is s and s.load.n_ctx == 4096  # the defaults unchanged


def test_presets_round_trip_through_the_file(tmp_path):
    path = tmp_path / "settings.json"
    s = Settings()
    s.set_preset("smollm2-135m-instruct", Preset(sampling={"temperature": 0.1}, system_prompt=""))
    save_settings(s, path)
    data = json.loads(path.read_text())
    assert data["presets"] == {"smollm2-135m-instruct": {"sampling": {"temperature": 0.1}, "system_prompt": ""}}
    back = open_settings(path).settings
    assert back.presets == s.presets and back.for_model("smollm2-135m-instruct").system_prompt == ""
    s.set_preset("smollm2-135m-instruct", Preset())  # empty: dropped
    assert s.presets == {} and "presets" not in s.to_dict()


def test_between_gives_what_the_window_changed_for_this_model():
    defaults = Settings()
    chosen = Settings()
    chosen.load.n_ctx, chosen.sampling.temperature, chosen.system_prompt = 2048, 0.0, "hi"
    p = Preset.between(defaults, chosen)
    assert p.load == {"n_ctx": 2048} and p.sampling == {"temperature": 0.0} and p.speculation == {}
    assert p.system_prompt == "hi"
    assert not Preset.between(defaults, Settings())


@pytest.mark.parametrize("bad,match", [
    ({"load": {"n_ctx": -5}}, "context length"),
    ({"load": {"n_ubatch": 4096}}, "micro-batch"),
    ({"speculation": {"mode": "draft"}}, "draft model"),
    ({"sampling": {"temperature": "hot"}}, "temperature"),
    ({"load": ["n_ctx"]}, "JSON object"),
    ({"system_prompt": 5}, "system_prompt"),
    ("fast", "JSON object"),
])
def test_nonsense_presets_are_refused_saying_why(bad, match):
    with pytest.raises(SettingsError, match=match):
        Settings.from_dict({"presets": {"tiny": bad}})


@pytest.mark.parametrize("key", ["../etc", "a/b", "", "x" * 300, 5])
def test_preset_keys_are_library_ids_never_paths(key):
    with pytest.raises(SettingsError, match="library id"):
        Settings.from_dict({"presets": {key: {}}} if isinstance(key, str) else {"presets": {key: {}}})
    if isinstance(key, str):
        with pytest.raises(SettingsError):
            Settings().set_preset(key, Preset(load={"n_ctx": 512}))


def test_unknown_preset_keys_are_kept_and_ignored():
    s = Settings.from_dict({"presets": {"tiny": {"load": {"n_ctx": 512, "future_knob": 3}, "later": 1}}})
    assert s.for_model("tiny").load.n_ctx == 512
    assert s.to_dict()["presets"]["tiny"]["load"]["future_knob"] == 3


def test_a_mix_that_cannot_work_is_refused_when_applied():
    s = Settings()
    s.load.n_batch = 128
    s.set_preset("tiny", Preset(load={"n_ubatch": 512}))  # fine over the defaults, not over n_batch 128
    with pytest.raises(SettingsError, match="preset cannot be used"):
        s.for_model("tiny")


def test_a_broken_preset_is_moved_aside_and_the_good_ones_kept(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"presets": {"good": {"load": {"n_ctx": 512}}, "bad": {"load": {"n_ctx": "x"}}},
                                "sampling": {"temperature": 0.5}}))
    report = open_settings(path)
    assert report.warning and "the preset for bad" in report.warning
    assert set(report.settings.presets) == {"good"} and report.settings.sampling.temperature == 0.5
