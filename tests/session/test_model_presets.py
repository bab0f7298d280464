"""A model's preset (settings file, keyed by library id) goes over the defaults for its loads and never into them."""
from __future__ import annotations

from ggufdesk.core.settings import LoadSettings, Preset, Settings
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.models import ModelSession
from tests.session.test_models import Loads, Seen


def rig(**presets: Preset):
    settings = Settings()
    for key, preset in presets.items():
        settings.set_preset(key, preset)
    engine, view = Loads(), Seen()
    return ModelSession(engine=engine, settings=settings, view=view), engine, view


def test_the_preset_is_used_for_its_model_and_the_defaults_stay():
    models, engine, _ = rig(tiny=Preset(load={"n_ctx": 1024, "type_k": "q8_0"}))
    models.load("/m/tiny.gguf", preset="tiny")
    assert engine.asked[-1][1].n_ctx == 1024 and engine.asked[-1][1].type_k == "q8_0"
    assert models.settings.load == LoadSettings()  # the defaults are untouched
    models.load("/m/other.gguf", preset="other")
    assert engine.asked[-1][1] == LoadSettings()


def test_explicit_settings_become_the_defaults_and_the_preset_still_goes_over_them():
    models, engine, _ = rig(tiny=Preset(load={"n_ctx": 1024}))
    models.load("/m/tiny.gguf", LoadSettings(n_ctx=8192, n_batch=256, n_ubatch=256), preset="tiny")
    assert (engine.asked[-1][1].n_ctx, engine.asked[-1][1].n_batch) == (1024, 256)
    assert models.settings.load.n_ctx == 8192


def test_recovery_after_a_failed_load_reloads_with_the_preset_without_making_it_the_defaults():
    models, engine, _ = rig(tiny=Preset(load={"n_ctx": 1024}))
    models.load("/m/tiny.gguf", preset="tiny")
    models.on_event(P.Loaded(model="/m/tiny.gguf", n_ctx=1024))
    models.load("/m/broken.gguf")
    models.on_event(P.Error(kind="load", message="bad file"))
    assert models.state.phase == "recovering" and engine.asked[-1] == ("/m/tiny.gguf", LoadSettings(n_ctx=1024))
    assert models.settings.load.n_ctx == 4096


def test_a_preset_that_cannot_work_with_the_defaults_is_said_and_the_defaults_are_used():
    models, engine, view = rig(tiny=Preset(load={"n_ubatch": 512}))
    models.settings.load = LoadSettings(n_batch=128, n_ubatch=128)
    models.load("/m/tiny.gguf", preset="tiny")
    assert engine.asked[-1][1].n_ubatch == 128
    assert view.notices and "preset cannot be used" in view.notices[0][1]
