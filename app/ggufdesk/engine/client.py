"""Parent side of the engine process (no Qt): spawn, send requests, receive events, cancel, restart."""
from __future__ import annotations

import itertools
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine import protocol as P

log = logging.getLogger("ggufdesk.engine.client")

MAX_RESTARTS = 3  # within RESTART_WINDOW_S, then give up
RESTART_WINDOW_S = 60.0


class EngineError(KnownError):
    """The engine reported an error (load failure, bad settings, crash)."""

    def __init__(self, event: P.Error) -> None:
        super().__init__(event.message)
        self.event = event


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


class EngineClient:
    """One engine child process and the conversation with it.

    Events are delivered to `on_event` (called on a reader thread) or, without it, queued for
    `stream()` / `events()`. After a crash the client reports it, starts a fresh engine and
    re-sends the last load that succeeded (a load that crashed the engine is not retried).
    """

    def __init__(
        self,
        *,
        on_event: Callable[[Any], None] | None = None,
        auto_restart: bool = True,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.on_event = on_event
        self.auto_restart = auto_restart
        self.command = command or [sys.executable, "-m", "ggufdesk.engine.worker"]
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ready: P.Ready | None = None
        self.loaded: P.Loaded | None = None
        self.stderr_tail: deque[str] = deque(maxlen=60)
        self._queue: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._inflight: set[str] = set()
        self._pending_load: P.Load | None = None
        self._good_load: P.Load | None = None
        self._last_error: P.Error | None = None
        self._restarts: deque[float] = deque(maxlen=MAX_RESTARTS)
        self._closing = False
        self._generation = 0  # bumps with each spawned process
        self._respawned = threading.Event()  # cleared while a crashed engine is being replaced
        self._respawned.set()

    # ---- process ------------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> P.Ready:
        """Spawn the engine and wait for it to say it is ready."""
        self._closing = False
        return self._spawn(timeout)

    def _spawn(self, timeout: float) -> P.Ready:
        with self._cond:
            self.ready = None
            self._generation += 1
            gen = self._generation
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb attach on abort: crash fast, say why
        self.proc = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, bufsize=0,
        )
        proc = self.proc
        threading.Thread(target=self._read_events, args=(proc, gen), daemon=True,
                         name="engine-events").start()
        threading.Thread(target=self._read_stderr, args=(proc,), daemon=True,
                         name="engine-stderr").start()
        with self._cond:
            ok = self._cond.wait_for(lambda: self.ready is not None or proc.poll() is not None, timeout)
            if self.ready is None:
                why = describe_exit(proc.poll()) if ok else f"no answer in {timeout:.0f} s"
                tail = " / ".join(list(self.stderr_tail)[-3:])
                raise KnownError(f"the engine did not start ({why}){': ' + tail if tail else ''}")
            return self.ready

    def _read_stderr(self, proc: subprocess.Popen) -> None:
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self.stderr_tail.append(line)
                log.debug("engine: %s", line)

    def _read_events(self, proc: subprocess.Popen, gen: int) -> None:
        for raw in proc.stdout:
            try:
                event = P.decode(raw)
            except P.ProtocolError as e:
                log.warning("engine sent a bad line: %s", e)
                continue
            self._handle(event)
        proc.wait()
        time.sleep(0.05)  # let the stderr reader catch the last words
        if gen == self._generation and not self._closing:
            self._crashed(proc)

    def _handle(self, event: Any) -> None:
        with self._cond:
            if isinstance(event, P.Ready):
                self.ready = event
            elif isinstance(event, P.Loaded):
                self.loaded = event
                self._good_load, self._pending_load = self._pending_load, None
            elif isinstance(event, P.Unloaded):
                self.loaded = None
                self._good_load = None
            elif isinstance(event, P.Error):
                self._last_error = event
                if event.kind in ("load", "settings") and event.id is None:
                    self._pending_load = None
            if isinstance(event, (P.Done, P.Error)) and event.id is not None:
                self._inflight.discard(event.id)
            self._cond.notify_all()
        self._deliver(event)

    def _deliver(self, event: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # noqa: BLE001 - a broken listener must not stop the reader
                log.exception("event listener failed")
        else:
            self._queue.put(event)

    def _crashed(self, proc: subprocess.Popen) -> None:
        self._respawned.clear()
        try:
            self._report_and_restart(proc)
        finally:
            self._respawned.set()

    def _report_and_restart(self, proc: subprocess.Popen) -> None:
        why = describe_exit(proc.returncode)
        lines = [ln.strip() for ln in self.stderr_tail if ln.strip()]
        telling = [ln for ln in lines if re.search(r"GGML_ASSERT|error|what\(\)|terminate|abort", ln, re.I)]
        detail = "\n".join(self.stderr_tail)
        reason = why + (f": {(telling or lines)[-1]}" if lines else "")
        reason += self._rpc_loss(self._pending_load or self._good_load)
        with self._cond:
            inflight, self._inflight = sorted(self._inflight), set()
            crashed_load, self._pending_load = self._pending_load, None
            self.loaded = None
        if crashed_load is not None:
            self._handle(P.Error(kind="load", message=(
                f"llama.cpp crashed while loading {os.path.basename(crashed_load.model)} ({reason})"),
                detail=detail))
        restarting = self.auto_restart and self._may_restart()
        suffix = "; restarting" if restarting else ""
        for rid in inflight or [None]:
            if rid is None and crashed_load is not None:
                continue
            self._handle(P.Error(kind="crash", id=rid, message=f"the engine stopped ({reason}){suffix}",
                                 detail=detail))
        if not restarting:
            if self.auto_restart:
                self._handle(P.Error(kind="crash", message="the engine keeps crashing; not restarting it"))
            return
        try:
            self._spawn(timeout=60.0)
        except KnownError as e:
            self._handle(P.Error(kind="crash", message=str(e)))
            return
        if self._good_load is not None:
            self._send_load(self._good_load)

    def _rpc_loss(self, load: P.Load | None) -> str:
        """With RPC workers: name the lost ones and reload without them, or say what is missing."""
        if load is None or not load.settings.get("rpc"):
            return ""
        from dataclasses import replace

        from ggufdesk.core.distributed import after_worker_loss

        note, settings = after_worker_loss(load.model, load.settings)
        if note and self._good_load is not None:
            self._good_load = None if settings is None else replace(self._good_load, settings=settings)
        return f"; {note}" if note else ""

    def _may_restart(self) -> bool:
        now = time.monotonic()
        if len(self._restarts) == MAX_RESTARTS and now - self._restarts[0] < RESTART_WINDOW_S:
            return False
        self._restarts.append(now)
        return True

    def _send(self, msg: Any) -> None:
        if threading.current_thread().name != "engine-events":
            self._respawned.wait(90.0)  # a request made during a restart goes to the new engine
        if not self.alive:
            raise KnownError("the engine is not running")
        data = P.encode(msg).encode("utf-8")
        with self._write_lock:
            try:
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise KnownError(f"the engine is not running ({e})") from None

    # ---- requests -----------------------------------------------------------------------------

    def load(
        self,
        model: str,
        *,
        settings: LoadSettings | dict | None = None,
        speculation: SpeculationSettings | dict | None = None,
        draft: str | None = None,
        wait: bool = True,
        timeout: float = 600.0,
    ) -> P.Loaded | None:
        """Load a model; with wait=True return the Loaded event or raise EngineError."""
        msg = P.Load(model=str(model), settings=P.fields_of(settings), draft=draft,
                     speculation=P.fields_of(speculation))
        with self._cond:
            self.loaded = None
            self._last_error = None
        self._send_load(msg)
        if not wait:
            return None
        with self._cond:
            self._cond.wait_for(lambda: self.loaded is not None or self._load_failed(), timeout)
            if self.loaded is None:
                err = self._last_error or P.Error(kind="load", message="the model did not load in time")
                raise EngineError(err)
            return self.loaded

    def _load_failed(self) -> bool:
        e = self._last_error
        return e is not None and e.id is None and e.kind in ("load", "settings", "crash")

    def _send_load(self, msg: P.Load) -> None:
        with self._cond:
            self._pending_load = msg
        self._send(msg)

    def generate(
        self,
        *,
        prompt: str | None = None,
        messages: list[dict[str, str]] | None = None,
        sampling: SamplingSettings | dict | None = None,
        speculation: SpeculationSettings | dict | None = None,
        context_policy: str = "truncate",
        request_id: str | None = None,
    ) -> str:
        """Start a generation; returns its request id (events follow)."""
        rid = request_id or f"r{next(self._ids)}"
        msg = P.Generate(id=rid, prompt=prompt, messages=messages, sampling=P.fields_of(sampling),
                         speculation=P.fields_of(speculation) if speculation is not None else None,
                         context_policy=context_policy)
        with self._cond:
            self._inflight.add(rid)
        try:
            self._send(msg)
        except KnownError:
            with self._cond:
                self._inflight.discard(rid)
            raise
        return rid

    def cancel(self, rid: str) -> None:
        if self.alive:
            self._send(P.Cancel(id=rid))

    def unload(self) -> None:
        self._send(P.Unload())

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask the engine to exit; terminate, then kill, if it does not."""
        self._closing = True
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                self._send(P.Shutdown())
                proc.stdin.close()
        except (KnownError, OSError):
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def kill(self) -> None:
        """SIGKILL the engine (tests; a hard stop). The client treats it as a crash."""
        if self.alive:
            self.proc.kill()

    # ---- receiving (without on_event) ---------------------------------------------------------

    def events(self, timeout: float | None = None) -> Iterator[Any]:
        """Queued events as they come; stops after `timeout` seconds of silence."""
        while True:
            try:
                yield self._queue.get(timeout=timeout)
            except queue.Empty:
                return

    def stream(self, rid: str, timeout: float = 600.0) -> Iterator[Any]:
        """Events of request rid, ending with its Done or Error."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KnownError(f"no answer from the engine in {timeout:.0f} s")
            try:
                event = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if getattr(event, "id", None) != rid:
                continue
            yield event
            if isinstance(event, (P.Done, P.Error)):
                return

    def __enter__(self) -> EngineClient:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
