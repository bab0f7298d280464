"""Model loading as plain unit tests: the last good model comes back after a failed load; no Qt."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings, Settings, SpeculationSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.models import ModelSession, ModelState, ModelView, base_model_advice


class Loads:
    """Records what the engine was asked to load."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, LoadSettings | None]] = []

    def load(self, model: str, settings: LoadSettings | None = None,
             speculation: SpeculationSettings | None = None) -> None:
        self.asked.append((model, settings))


class Seen(ModelView):
    def __init__(self) -> None:
        self.states: list[ModelState] = []
        self.notices: list[tuple[str, str]] = []
        self.failed = 0

    def model_state_changed(self, state: ModelState) -> None:
        self.states.append(state)

    def load_failed(self) -> None:
        self.failed += 1

    def notice(self, text: str, level: str = "info") -> None:
        self.notices.append((level, text))


@pytest.fixture
def rig():
    engine, view, saved = Loads(), Seen(), []
    models = ModelSession(engine=engine, settings=Settings(), view=view,
                          save=lambda s: saved.append(s.model))
    return models, engine, view, saved


def loaded(path: str, **kw) -> P.Loaded:
    return P.Loaded(model=path, n_ctx=kw.pop("n_ctx", 4096), load_s=1.25, **kw)


def test_a_load_shows_loading_then_the_models_facts_and_remembers_it(rig):
    models, engine, view, saved = rig
    models.load("/m/a.gguf", LoadSettings(n_ctx=2048))
    assert engine.asked == [("/m/a.gguf", LoadSettings(n_ctx=2048))]
    assert models.state.phase == "loading" and models.state.words() == "Loading a.gguf…"
    models.on_event(loaded("/m/a.gguf", n_ctx=2048))
    assert models.state.phase == "loaded" and models.path == "/m/a.gguf"
    assert models.state.words() == "a.gguf · 2048 ctx · CPU · loaded in 1.2 s"
    assert models.settings.model == "/m/a.gguf" and saved == ["/m/a.gguf"]
    assert [s.phase for s in view.states] == ["loading", "loaded"]


def test_a_failed_load_brings_the_last_good_model_back_with_its_settings(rig):
    models, engine, view, _ = rig
    models.load("/m/good.gguf", LoadSettings(n_ctx=2048))
    models.on_event(loaded("/m/good.gguf"))
    models.load("/m/bad.gguf", LoadSettings(n_ctx=65536))
    models.on_event(P.Error(kind="load", message="invalid magic characters"))
    assert engine.asked[-1] == ("/m/good.gguf", LoadSettings(n_ctx=2048))
    assert models.settings.load == LoadSettings(n_ctx=2048)  # the settings that worked
    assert models.state.phase == "recovering" and models.path == "/m/good.gguf"
    assert models.state.words() == "Loading good.gguf again…"
    assert view.failed == 1
    assert view.notices[-1] == ("error", "could not load the model: invalid magic characters; "
                                         "good.gguf is loaded again")
    models.on_event(loaded("/m/good.gguf"))
    assert models.state.phase == "loaded" and not models.recovering


def test_new_settings_that_fail_on_the_same_model_give_back_the_old_settings(rig):
    models, engine, _, _ = rig
    models.load("/m/a.gguf", LoadSettings(n_ctx=2048))
    models.on_event(loaded("/m/a.gguf"))
    models.load("/m/a.gguf", LoadSettings(n_ctx=131072))
    models.on_event(P.Error(kind="load", message="out of memory", out_of_memory=True))
    assert engine.asked[-1] == ("/m/a.gguf", LoadSettings(n_ctx=2048))


def test_a_failed_load_with_nothing_before_leaves_nothing_but_keeps_the_path_to_retry(rig):
    models, engine, view, _ = rig
    models.load("/m/bad.gguf")
    models.on_event(P.Error(kind="load", message="no"))
    assert models.state == ModelState(phase="none") and models.state.words() == "No model loaded"
    assert models.path == "/m/bad.gguf"  # Engine settings can try it again with other settings
    assert len(engine.asked) == 1 and view.failed == 1


def test_when_the_last_good_model_fails_too_it_is_forgotten(rig):
    models, engine, view, _ = rig
    models.load("/m/good.gguf")
    models.on_event(loaded("/m/good.gguf"))
    models.load("/m/bad.gguf")
    models.on_event(P.Error(kind="load", message="bad"))
    models.on_event(P.Error(kind="load", message="the file is gone"))  # the recovery fails
    assert models.state.phase == "none" and models.path is None and models.last_good is None
    assert len(engine.asked) == 3  # no endless loop of retries
    assert view.notices[-1] == ("error", "could not load the model: the file is gone")
    models.load("/m/other.gguf")
    models.on_event(P.Error(kind="load", message="bad"))
    assert len(engine.asked) == 4 and models.state.phase == "none"


def test_out_of_memory_names_the_recommended_settings(rig):
    models, _, view, _ = rig
    models.recommended = lambda: (LoadSettings(n_gpu_layers=12, n_ctx=2048), SpeculationSettings())
    models.load("/m/big.gguf")
    models.on_event(P.Error(kind="load", message="cudaMalloc failed", out_of_memory=True))
    text = view.notices[-1][1]
    assert "try fewer GPU layers or a smaller context" in text
    assert "(recommended here: 12 GPU layers, context 2048)" in text


def test_the_out_of_memory_hint_is_optional(rig):
    models, _, view, _ = rig

    def broken() -> tuple[LoadSettings, SpeculationSettings]:
        raise RuntimeError("the planner failed")

    models.recommended = broken
    models.load("/m/big.gguf")
    models.on_event(P.Error(kind="load", message="oom", out_of_memory=True))
    assert view.notices[-1][1].endswith("in Engine settings")


def test_a_settings_file_that_cannot_be_written_is_said_not_raised(rig):
    models, _, view, _ = rig

    def full_disk(_s: Settings) -> None:
        raise OSError(28, "No space left on device")

    models.save = full_disk
    models.load("/m/a.gguf")
    models.on_event(loaded("/m/a.gguf"))
    assert models.state.phase == "loaded"
    assert view.notices == [("error", "could not save settings: [Errno 28] No space left on device")]


def test_engine_restarts_are_shown_and_the_model_comes_back(rig):
    models, _, _, _ = rig
    models.load("/m/a.gguf")
    models.on_event(loaded("/m/a.gguf"))
    models.on_event(P.Lifecycle(state="starting", restarted=True))
    assert models.state.words() == "Restarting the engine…"
    models.on_event(P.Lifecycle(state="loading", restarted=True))
    assert models.state.words() == "Restarting the engine: loading a.gguf again…"
    models.on_event(loaded("/m/a.gguf"))
    assert models.state.phase == "loaded"
    models.on_event(P.Lifecycle(state="failed", reason="the engine keeps stopping"))
    assert models.state.words() == "The engine is not running"


def test_unloaded_after_loaded_means_nothing_is_loaded(rig):
    models, _, _, _ = rig
    models.load("/m/a.gguf")
    models.on_event(P.Unloaded())  # the old model goes before the new one comes: still loading
    assert models.state.phase == "loading"
    models.on_event(loaded("/m/a.gguf"))
    models.on_event(P.Unloaded())
    assert models.state.phase == "none" and models.path is None


def test_other_errors_are_not_the_model_sessions_business(rig):
    models, _, view, _ = rig
    models.load("/m/a.gguf")
    models.on_event(loaded("/m/a.gguf"))
    models.on_event(P.Error(kind="generate", message="x", id="r1"))
    assert models.state.phase == "loaded" and view.notices == []


def test_words_without_the_name_when_a_switcher_shows_it():
    state = ModelState(phase="loaded", path="/m/a.gguf",
                       loaded=P.Loaded(model="/m/a.gguf", n_ctx=512, n_gpu_layers=3, load_s=0.5,
                                       draft="/m/d.gguf"))
    assert state.words() == "a.gguf + draft d.gguf · 512 ctx · GPU · loaded in 0.5 s"
    assert state.words(with_name=False) == "draft d.gguf · 512 ctx · GPU · loaded in 0.5 s"
    assert ModelState(phase="loading", path="/m/a.gguf").words(with_name=False) == "Loading…"


def test_base_model_advice_names_the_model():
    assert base_model_advice(P.Loaded(model="/m/base.gguf")).startswith(
        "base.gguf is a base model: it continues the text you start")


def local(name: str, size: int = 1000, *, source: str = "user", mid: str = ""):
    from pathlib import Path

    from ggufdesk.core.library import LocalModel

    return LocalModel(path=Path(f"/models/{name}"), name=name, size=size, source=source, quant=None,
                      id=mid)


def test_the_base_model_banner_names_only_a_model_that_can_be_had():
    from ggufdesk.core import catalog
    from ggufdesk.session.models import chat_models_here

    base = P.Loaded(model="/models/gemma-3-270m-q4_k_m.gguf", chat_format="completion")
    here = chat_models_here([
        local("gemma-3-270m-q4_k_m.gguf"), local("Qwen2.5-7B-Instruct-Q4_K_M.gguf", 4 << 30),
        local("SmolLM2 135M Instruct", 98 << 20, source="starter", mid="smollm2-135m-instruct"),
        local("phi-2.Q4_0.gguf")])
    text = base_model_advice(base, local=here, online=True, catalog=catalog.load())
    assert text.endswith("e.g. SmolLM2 135M Instruct (smollm2-135m-instruct), which is on this "
                         "computer (Model ▸ Choose model…).")  # the chat starter, not a download
    offline = base_model_advice(base, online=False, catalog=catalog.load())
    assert offline.endswith("choose a chat-tuned model (Model ▸ Choose model…).")  # no name
    online = base_model_advice(base, online=True, catalog=catalog.load())
    assert "(Model ▸ Choose model… downloads it)" in online


def test_chat_tuned_names():
    from ggufdesk.session.models import chat_models_here

    names = ["gemma-3-1b-it-Q4_K_M.gguf", "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "mistral-7b-chat.gguf",
             "gemma-3-270m-q4_k_m.gguf", "llama-2-7b.Q4_0.gguf", "tiny-llama-kit.gguf"]
    assert {m.name for m in chat_models_here([local(n) for n in names])} == set(names[:3])
    gemma = local("Gemma 3 270M", source="starter", mid="gemma-3-270m")  # a starter that does not chat
    assert chat_models_here([gemma]) == []
