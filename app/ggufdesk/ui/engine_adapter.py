"""The one QObject around engine/link/client.py: reader-thread events become queued, typed Qt signals."""
from __future__ import annotations

import collections
import logging
import threading
from PySide6.QtCore import QObject, Signal

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as p
from ggufdesk.engine.link.api import ClientFactory, EngineAPI

log = logging.getLogger("ggufdesk.ui.engine")


def default_client_factory(**kwargs: object) -> EngineAPI:
    from ggufdesk.engine.link.client import EngineClient

    factory: ClientFactory = EngineClient  # imported on first use: the window opens before the engine
    return factory(**kwargs)


class EngineBridge(QObject):
    """Start/load/generate/cancel on the engine; every event comes back as a signal on the GUI thread.

    No method waits for the engine: the client queues requests and starts, restarts and watches
    the process on its own threads. Tokens that arrive in a burst are merged into one Token per
    request before they reach the GUI, so a fast engine costs the event loop one slot call per
    burst, not one per token. `engine_event` carries every event (the session layer's input); the typed
    signals below are for widgets that want one kind.
    """

    engine_event = Signal(object)  # any protocol Event, in order (not `event`: QObject.event())
    started = Signal(p.Ready)  # Ready
    loaded = Signal(p.Loaded)  # Loaded
    unloaded = Signal()
    progress = Signal(p.Progress)  # Progress
    token = Signal(p.Token)  # Token (possibly several merged)
    stats = Signal(p.Stats)  # Stats
    done = Signal(p.Done)  # Done
    error = Signal(p.Error)  # Error whose kind is not in STOP_KINDS
    crashed = Signal(p.Error)  # Error with kind "crash" or "hung": the engine stopped
    lifecycle = Signal(p.Lifecycle)  # Lifecycle: the engine's state and why
    log_line = Signal(p.Log)  # Log
    start_failed = Signal(str)
    _wake = Signal()

    def __init__(
        self, *, command: list[str] | None = None,
        client_factory: ClientFactory = default_client_factory, parent: QObject | None = None,
        client_options: dict[str, object] | None = None,
    ) -> None:
        super().__init__(parent)
        self._command = command
        self._factory = client_factory
        self._options = client_options or {}
        self._client: EngineAPI | None = None
        self._queue: collections.deque[p.Event] = collections.deque()
        self._lock = threading.Lock()
        self._woken = False
        self.state: p.EngineState = "stopped"
        self.state_reason = ""
        self.loaded_event: p.Loaded | None = None
        self.active_id: str | None = None
        self._wake.connect(self._drain)

    @property
    def is_started(self) -> bool:
        return self.state not in ("stopped", "failed", "starting")

    # ---- reader thread side -------------------------------------------------------------------

    def _on_event(self, event: p.Event) -> None:
        """Called on the client's threads: queue it and wake the GUI thread once per burst."""
        with self._lock:
            self._queue.append(event)
            if self._woken:
                return
            self._woken = True
        self._wake.emit()

    # ---- GUI thread side ----------------------------------------------------------------------

    def _drain(self) -> None:
        with self._lock:
            events = list(self._queue)
            self._queue.clear()
            self._woken = False
        merged: list[p.Event] = []
        for ev in events:
            last = merged[-1] if merged else None
            if isinstance(ev, p.Token) and isinstance(last, p.Token) and last.id == ev.id \
                    and last.reasoning == ev.reasoning:  # thinking and answer stay apart
                merged[-1] = p.Token(id=ev.id, text=last.text + ev.text, reasoning=ev.reasoning)
            else:
                merged.append(ev)
        for ev in merged:
            self._dispatch(ev)

    def _dispatch(self, ev: p.Event) -> None:
        if isinstance(ev, (p.Done, p.Error)) and ev.id is not None and ev.id == self.active_id:
            self.active_id = None
        if isinstance(ev, p.Loaded):
            self.loaded_event = ev
        elif isinstance(ev, p.Unloaded) or (isinstance(ev, p.Error) and ev.kind in p.STOP_KINDS):
            self.loaded_event = None
        elif isinstance(ev, p.Lifecycle):
            self.state, self.state_reason = ev.state, ev.reason
            if ev.state != "loaded":
                self.loaded_event = None
        self.engine_event.emit(ev)
        self._emit_typed(ev)

    def _emit_typed(self, ev: p.Event) -> None:
        """The one typed signal for the event's kind (after engine_event, which carries them all)."""
        if isinstance(ev, p.Token):
            self.token.emit(ev)
        elif isinstance(ev, p.Stats):
            self.stats.emit(ev)
        elif isinstance(ev, p.Progress):
            self.progress.emit(ev)
        elif isinstance(ev, p.Done):
            self.done.emit(ev)
        elif isinstance(ev, p.Loaded):
            self.loaded.emit(ev)
        elif isinstance(ev, p.Unloaded):
            self.unloaded.emit()
        elif isinstance(ev, p.Ready):
            self.started.emit(ev)
        elif isinstance(ev, p.Error):
            (self.crashed if ev.kind in p.STOP_KINDS else self.error).emit(ev)
        elif isinstance(ev, p.Lifecycle):
            self.lifecycle.emit(ev)
            if ev.state == "failed":
                self.start_failed.emit(ev.reason)
        elif isinstance(ev, p.Log):
            self.log_line.emit(ev)

    # ---- commands (none of them waits for the engine) -----------------------------------------

    @property
    def pid(self) -> int | None:
        return self._client.pid if self._client is not None else None

    def devices(self) -> list[dict[str, object]]:
        """The engine's ggml device list (from its Ready event; [] until it has started)."""
        ready = self._client.ready if self._client is not None else None
        return list(ready.devices) if ready is not None else []

    def start(self) -> None:
        """Spawn the engine (on the client's supervisor thread); Lifecycle events tell how it went."""
        if self._client is not None:
            if self.state == "failed":  # try again: a load after a failed start starts it anew
                self.state = "starting"
                self._client.start(wait=False)
            return
        self._client = self._factory(on_event=self._on_event, auto_restart=True,
                                     command=self._command, **self._options)
        self.state = "starting"
        self._client.start(wait=False)

    def _running(self) -> EngineAPI:
        """The client; KnownError when the engine was never started or was shut down."""
        if self._client is None:
            raise KnownError("the engine is not running")
        return self._client

    def load(self, model: str, settings: LoadSettings | None = None,
             speculation: SpeculationSettings | None = None) -> None:
        settings = settings or LoadSettings()
        speculation = speculation or SpeculationSettings()
        self.start()
        self.loaded_event = None
        try:
            draft = speculation.draft_model if speculation.mode == "draft" else None
            self._running().load(model, settings=settings, speculation=speculation, draft=draft,
                              wait=False)
        except Exception as e:  # noqa: BLE001 - a dead engine is reported like a load error
            self.error.emit(p.Error(kind="load", message=str(e)))

    def generate(self, *, messages: list[dict[str, object]] | None = None, prompt: str | None = None,
                 sampling: SamplingSettings | None = None, **extra: object) -> str:
        """Queue a generation; raises KnownError when the engine is gone for good. `extra` are
        further Generate fields (the MCP tools offered)."""
        # extra: Generate fields of many types (tools, tool_choice, images...) that the client
        # takes as **extra and protocol.Generate validates; mypy would match each against
        # request_id/logprobs too.
        rid: str = self._running().generate(
            prompt=prompt, messages=messages, sampling=sampling or SamplingSettings(), speculation=None,
            **extra)  # type: ignore[arg-type]
        self.active_id = rid
        return rid

    def cancel(self, rid: str | None = None) -> None:
        rid = rid or self.active_id
        if rid and self._client is not None:
            self._client.cancel(rid)

    def unload(self) -> None:
        if self._client is not None and self.is_started:
            self._client.unload()

    def shutdown(self, timeout: float = 5.0) -> None:
        client, self._client = self._client, None
        self.state = "stopped"
        if client is not None:
            try:
                client.shutdown(timeout=timeout)
            except Exception:
                log.exception("engine shutdown failed")

    def kill(self) -> None:
        """SIGKILL the engine child (tests, and the crash-recovery bench)."""
        if self._client is not None:
            self._client.kill()
