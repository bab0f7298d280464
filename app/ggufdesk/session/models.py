"""Which model is loaded and what happens when a load fails: the last good model comes back.

The window, and any other front end that loads models on one engine, drives loading through a
ModelSession: `load()` asks the engine, `on_event()` takes every engine event, and the view is told
the state (one enum field and the facts) and the notices to show. No Qt, no waiting: the engine
answers with events.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

from ggufdesk.core import catalog as catalog_module
from ggufdesk.core import downloads, library, starter
from ggufdesk.core.catalog import Catalog
from ggufdesk.core.errors import KnownError, SettingsError
from ggufdesk.core.library import LocalModel
from ggufdesk.core.settings import LoadSettings, Settings, SpeculationSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.session.conversation import Level

log = logging.getLogger("ggufdesk.session.models")

# none: nothing is loaded; loading: the user's choice is on its way; recovering: a load failed and
# the last good model is being loaded again; loaded; restarting: the engine stopped and its
# supervisor restarts it (and loads `path` again, if set); failed: the engine cannot run.
ModelPhase = Literal["none", "loading", "recovering", "loaded", "restarting", "failed"]


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """A model and the settings it is (to be) loaded with (`preset`: the library id whose preset
    made them, so they are not taken for the defaults)."""

    path: str
    load: LoadSettings
    speculation: SpeculationSettings
    preset: str | None = None


@dataclass(frozen=True, slots=True)
class ModelState:
    """What the header shows: the phase, the model concerned, and the engine's facts once loaded."""

    phase: ModelPhase = "none"
    path: str | None = None
    loaded: P.Loaded | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name if self.path else ""

    def words(self, *, with_name: bool = True) -> str:
        """One line for the window's header (`with_name=False` when a switcher shows the name)."""
        name = self.name if with_name else ""
        if self.phase == "loaded" and self.loaded is not None:
            ev = self.loaded
            where = "GPU" if ev.n_gpu_layers else "CPU"
            parts = [name] if name else []
            if ev.draft:
                parts.append(f"draft {Path(ev.draft).name}")
            facts = f"{ev.n_ctx} ctx · {where} · loaded in {ev.load_s:.1f} s"
            return " · ".join([" + ".join(parts), facts]) if parts else facts
        if self.phase == "loading":
            return f"Loading {name}…" if name else "Loading…"
        if self.phase == "recovering":
            return f"Loading {name} again…" if name else "Loading it again…"
        if self.phase == "restarting":
            return (f"Restarting the engine: loading {name} again…" if name
                    else "Restarting the engine…")
        if self.phase == "failed":
            return "The engine is not running"
        return "No model loaded"


class ModelEngine(Protocol):
    """What loading needs of the engine: the GUI's EngineBridge fits (events come back through
    on_event, a load that cannot be sent as an Error event of kind "load")."""

    def load(self, model: str, settings: LoadSettings | None = None,
             speculation: SpeculationSettings | None = None) -> None: ...


class ModelView:
    """What a front end is told about models. Every method has a do-nothing default."""

    def model_state_changed(self, state: ModelState) -> None: ...

    def load_failed(self) -> None:
        """A load failed: the engine holds no model now (until the last good one is back)."""

    def notice(self, text: str, level: Level = "info") -> None: ...


class ModelSession:
    """Loads models on one engine, remembers the last model that loaded, and loads it again when a
    later load fails (once: if that fails too, nothing is loaded and the user is told).

    `settings` is the application's Settings object: its load/speculation follow what is loaded,
    and `settings.model` is the last model that loaded (saved with `save`, when given).
    `recommended()` gives this machine's recommended settings for an out-of-memory hint."""

    def __init__(self, *, engine: ModelEngine, settings: Settings, view: ModelView | None = None,
                 recommended: Callable[[], tuple[LoadSettings, SpeculationSettings]] | None = None,
                 save: Callable[[Settings], None] | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.view = view or ModelView()
        self.recommended = recommended
        self.save = save
        self.state = ModelState()
        # The model the user works with: loaded, being loaded, or the one whose load just failed
        # (Engine settings then retries it with other settings). None when nothing is.
        self.path: str | None = None
        self.loading: ModelChoice | None = None
        self.last_good: ModelChoice | None = None
        self.recovering = False

    @property
    def loaded(self) -> P.Loaded | None:
        return self.state.loaded

    def _set(self, phase: ModelPhase, path: str | None, loaded: P.Loaded | None = None) -> None:
        self.state = ModelState(phase=phase, path=path, loaded=loaded)
        self.view.model_state_changed(self.state)

    # ---- commands -------------------------------------------------------------------------------

    def load(self, path: str, load: LoadSettings | None = None,
             speculation: SpeculationSettings | None = None, *, preset: str | None = None) -> None:
        """Load `path` (with new default settings, or the current ones); the answer comes as events.

        `preset`: the model's library id; its preset in `settings.presets` (if any) goes over the
        defaults for this load, and the defaults stay as they are."""
        if load is not None:
            self.settings.load = load
        if speculation is not None:
            self.settings.speculation = speculation
        try:
            used = self.settings.for_model(preset)
        except SettingsError as e:  # a preset that cannot work with these defaults: say so, use the defaults
            self.view.notice(f"{e}; loading with the default settings", "warning")
            used = self.settings
        self.loading = ModelChoice(path, used.load, used.speculation,
                                   preset if used is not self.settings else None)
        self.recovering = False
        self.path = path
        self._set("loading", path)
        self.engine.load(path, used.load, used.speculation)

    def _load_again(self, good: ModelChoice) -> None:
        self.recovering = True
        if good.preset is None:  # the defaults it loaded with become the defaults again
            self.settings.load, self.settings.speculation = good.load, good.speculation
        self.path = good.path
        self._set("recovering", good.path)
        self.engine.load(good.path, good.load, good.speculation)

    # ---- engine events --------------------------------------------------------------------------

    def on_event(self, ev: P.Event) -> None:
        if isinstance(ev, P.Loaded):
            self._on_loaded(ev)
        elif isinstance(ev, P.Error) and ev.kind in ("load", "settings"):
            self._on_load_error(ev)
        elif isinstance(ev, P.Unloaded) and self.state.phase == "loaded":
            self.path = None
            self._set("none", None)
        elif isinstance(ev, P.Lifecycle):
            self._on_lifecycle(ev)

    def _on_loaded(self, ev: P.Loaded) -> None:
        if self.loading is not None and self.loading.path == ev.model:
            self.last_good = self.loading
        elif self.last_good is None or self.last_good.path != ev.model:
            self.last_good = ModelChoice(ev.model, self.settings.load, self.settings.speculation)
        self.loading, self.recovering = None, False
        self.path = ev.model
        self._set("loaded", ev.model, ev)
        self.settings.model = ev.model  # the front end shares this object: changed in place
        if self.save is not None:
            try:
                self.save(self.settings)
            except OSError as e:
                self.view.notice(f"could not save settings: {e}", "error")

    def _on_load_error(self, ev: P.Error) -> None:
        msg = f"could not load the model: {ev.message}"
        if ev.out_of_memory:
            msg += f" — try fewer GPU layers or a smaller context in Engine settings{self._oom_hint()}"
        failed, self.loading = self.loading, None
        good = self.last_good
        self.view.load_failed()
        if good is not None and not self.recovering and (failed is None or failed != good):
            # A failed load must not leave the user without the model that worked: load it again.
            msg += f"; {Path(good.path).name} is loaded again"
            self._load_again(good)
        else:
            if self.recovering:  # the last good model failed too: forget it
                self.last_good, self.path = None, None
            self.recovering = False
            self._set("none", None)
        self.view.notice(msg, "error")

    def _on_lifecycle(self, ev: P.Lifecycle) -> None:
        if ev.state == "starting" and ev.restarted:
            self._set("restarting", None)
        elif ev.state == "loading" and ev.restarted:
            self._set("restarting", self.path)
        elif ev.state == "failed":
            self._set("failed", None)
        elif ev.state == "ready" and ev.reason:
            self._set("none", None)

    def _oom_hint(self) -> str:
        if self.recommended is None:
            return ""
        try:
            load, _ = self.recommended()
        except Exception:  # the hint is optional; the message stands without it
            log.debug("no recommended settings for the out-of-memory hint", exc_info=True)
            return ""
        return f" (recommended here: {load.n_gpu_layers} GPU layers, context {load.n_ctx})"


# A file name that says the model is chat-tuned: "…-Instruct-…", "…-it-…", "…-Chat-…".
CHAT_TUNED_NAME = re.compile(r"instruct|chat|(?:^|[-_. ])it(?:$|[-_. ])", re.IGNORECASE)


def named_chat_tuned(m: LocalModel) -> bool:
    """A starter says whether it chats; any other model's file name is taken at its word."""
    s = starter.by_id(m.id) if m.source == "starter" else None
    return s.chat if s is not None else bool(CHAT_TUNED_NAME.search(m.name))


def chat_models_here(models: Sequence[LocalModel],
                     is_chat: Callable[[LocalModel], bool] = named_chat_tuned) -> list[LocalModel]:
    """The local models that chat, the starters first, then the smallest (quickest to load)."""
    return sorted((m for m in models if is_chat(m)), key=lambda m: (m.source != "starter", m.size))


def base_model_advice(model: P.Loaded, *, local: Sequence[LocalModel] = (),
                      online: bool = False, catalog: Catalog | None = None) -> str:
    """What the window says when a base model loads: what it does, and a chat model the user can
    have now — one on this computer (the library, `local`: chat models only), else, online, the
    catalog's suggestion, else none by name (a name the offline model list does not have would
    send the user looking)."""
    text = (f"{Path(model.model).name} is a base model: it continues the text you start (no chat "
            "template). For a chat, choose a chat-tuned model")
    here = [m for m in local if str(m.path) != model.model]
    if here:
        m = here[0]
        name = f"{m.name} ({m.id})" if m.id and m.id != m.name else m.name
        return text + f", e.g. {name}, which is on this computer (Model ▸ Choose model…)."
    if online and catalog is not None and (entry := starter.chat_suggestion(catalog)) is not None:
        return text + f", e.g. {entry.name} (Model ▸ Choose model… downloads it)."
    return text + " (Model ▸ Choose model…)."


def find_base_model_advice(model: P.Loaded) -> str:
    """base_model_advice with what this machine has: the library (a name that says it chats is
    checked against the file's header) and, if that has nothing, the hub. It reads folders and
    headers and may ask the network (seconds): call it off the GUI thread."""
    def chats(m: LocalModel) -> bool:
        if not named_chat_tuned(m):
            return False
        return m.source == "starter" or bool(library.facts(m)["capabilities"]["chat_template"])

    local = chat_models_here(library.entries(), chats)
    if local:
        return base_model_advice(model, local=local)
    try:
        cat: Catalog | None = catalog_module.load()
    except KnownError:
        cat = None
    return base_model_advice(model, online=downloads.hub_reachable(), catalog=cat)
