"""Parent side of the engine process (no Qt): spawn, send requests, receive events, cancel, restart.

No call returns later than it must: requests go to a writer thread through a queue, and starting,
restarting and watching the engine happen on the client's own supervisor thread
(docs/architecture.md, "The process model").
"""
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
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Literal

from ggufdesk.core import procs
from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.link import engine_log
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.lifeline import PARENT_ENV

log = logging.getLogger("ggufdesk.engine.link.client")

MAX_RESTARTS = 3  # within RESTART_WINDOW_S, then give up
RESTART_WINDOW_S = 60.0
PING_INTERVAL_S = 2.0  # heartbeat period
HANG_TIMEOUT_S = 10.0  # no event at all for this long while a Ping is out: the engine is wedged
CANCEL_GRACE_S = 5.0  # a cancelled request that has not ended by then: kill and restart
START_TIMEOUT_S = 60.0


class EngineError(KnownError):
    """The engine reported an error (load failure, bad settings, crash)."""

    def __init__(self, event: P.Error) -> None:
        super().__init__(event.message)
        self.event = event


# What an engine's last words mean, where llama.cpp's line does not say what to do about them. A thread
# count far above the cores (`--threads 256` on 2 cores) loads, then ends the engine at its first step:
# libgomp exits when it cannot start the threads asked for.
CAUSES = ((re.compile(r"Thread creation failed"),
           "this machine would not start that many threads: set fewer (0 = one per core)"),)


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


@dataclass
class _Proc:
    """One spawned engine process and what the client knows about it."""

    popen: subprocess.Popen[bytes]
    gen: int
    last_seen: float  # monotonic time of its last event line
    kill_reason: str = ""  # set when the client killed it (hang, a cancel that did not land)
    ping_out: float = 0.0  # when the unanswered Ping was sent (0: none out)
    stderr: threading.Thread | None = None  # its stderr reader: joined before its last words are read


_Job = Literal["start", "exited", "close", "watch"]  # "watch": no job came, the watchdog runs


class EngineClient:
    """One engine child process and the conversation with it.

    Events are delivered to `on_event` (called on a reader thread) or, without it, queued for
    `stream()` / `events()`. Besides the engine's own events the client makes `Lifecycle` events
    (the process state and why) and `Error(kind="crash"|"hung")` when the process dies or wedges.
    After a crash it starts a fresh engine and re-sends the last load that succeeded (a load that
    crashed the engine is not retried; one whose draft model crashed it is retried without the
    draft).
    """

    def __init__(
        self,
        *,
        on_event: Callable[[P.Event], None] | None = None,
        auto_restart: bool = True,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        ping_interval: float = PING_INTERVAL_S,
        hang_timeout: float = HANG_TIMEOUT_S,
        cancel_grace: float = CANCEL_GRACE_S,
    ) -> None:
        self.on_event = on_event
        self.auto_restart = auto_restart
        self.command = command or [sys.executable, "-m", "ggufdesk.engine.runtime.worker"]
        self.env = env
        self.ping_interval = ping_interval
        self.hang_timeout = hang_timeout
        self.cancel_grace = cancel_grace
        self.ready: P.Ready | None = None
        self.supports_logprobs = True  # engine/link/api.py: Generate.logprobs is honoured
        self.loaded: P.Loaded | None = None
        self.state: P.EngineState = "stopped"
        self.reason = ""  # why the state is what it is (a crash, a failed reload, a give-up)
        self.stderr_tail: deque[str] = deque(maxlen=60)
        self._proc: _Proc | None = None
        self._queue: queue.Queue[P.Event] = queue.Queue()
        self._streams: dict[str, queue.Queue[P.Event]] = {}  # request id -> its events: streams run concurrently
        self._outbox: queue.Queue[P.Request | None] = queue.Queue()
        self._jobs: queue.Queue[tuple[_Job, int]] = queue.Queue()
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._accepting = threading.Event()  # the writer may write to the current process
        self._ids = itertools.count(1)
        self._inflight: set[str] = set()
        self._cancel_deadlines: dict[str, float] = {}
        self._pending_load: P.Load | None = None
        self._load_stage: P.Loading | None = None
        self._good_load: P.Load | None = None
        self._waiting: set[str] = set()  # load (and embed) ids a caller waits for
        self._results: dict[str, P.Event] = {}  # load or embed id -> how it ended
        self._private: set[str] = set()  # embed ids whose answer goes to the waiting caller only
        self._reload_id: str | None = None  # the load re-sent after a restart
        self._stop_reason = ""  # why the last engine stopped
        self._restarts: deque[float] = deque(maxlen=MAX_RESTARTS)
        self._closing = False
        self._gen = 0
        self._supervisor: threading.Thread | None = None
        self._writer: threading.Thread | None = None

    # ---- state --------------------------------------------------------------------------------

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        p = self._proc
        return p.popen if p else None

    @property
    def pid(self) -> int | None:
        p = self._proc
        return p.popen.pid if p else None

    @property
    def alive(self) -> bool:
        p = self._proc
        return p is not None and p.popen.poll() is None

    def problem(self) -> str | None:
        """What keeps the client from serving although its state may not say so yet (one of its
        threads is gone), else None. Read by health checks: cheap, from any thread."""
        if self._closing:
            return None
        for t in (self._supervisor, self._writer):
            if t is not None and not t.is_alive():
                return f"the engine client's {t.name} thread stopped; restart the app"
        return None

    def _set_state(self, state: P.EngineState, reason: str = "", *, restarted: bool = False) -> None:
        with self._cond:
            if state == self.state and reason == self.reason and not restarted:
                return
            self.state, self.reason = state, reason
            self._cond.notify_all()
        self._deliver(P.Lifecycle(state=state, reason=reason, restarted=restarted))

    # ---- start / supervise --------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S, *, wait: bool = True) -> P.Ready | None:
        """Start the engine; with wait=True block until it is ready (or raise KnownError)."""
        with self._cond:
            if self._closing:
                raise KnownError("this engine client was shut down; make a new one")
            if self._supervisor is None:
                self._supervisor = threading.Thread(target=self._supervise, name="engine-supervisor",
                                                    daemon=True)
                self._writer = threading.Thread(target=self._write_loop, name="engine-writer",
                                                daemon=True)
                self._supervisor.start()
                self._writer.start()
            if self.state not in ("starting", "ready", "loading", "loaded"):
                self.state = "starting"
                self._jobs.put(("start", 0))
        if not wait:
            return None
        with self._cond:
            self._cond.wait_for(lambda: self.state != "starting", timeout)
            if self.ready is None or self.state in ("failed", "starting", "stopped"):
                raise KnownError(self.reason or f"the engine did not start in {timeout:.0f} s")
            return self.ready

    def _supervise(self) -> None:
        """The one long-lived thread that spawns engines (so that the parent-death signal, which
        Linux ties to the spawning thread, fires only when the client itself goes), restarts them
        after a crash and runs the watchdog. A bug in one job is reported and the thread goes on:
        no thread of the client may die (issue 34)."""
        while True:
            try:
                job, gen = self._jobs.get(timeout=min(0.5, self.ping_interval))
            except queue.Empty:
                job, gen = "watch", 0
            if job == "close":
                return
            try:
                if job == "start":
                    self._spawn(restarted=False)
                elif job == "exited" and gen == self._gen:
                    self._exited()
                self._watch()
            except Exception as e:  # reported; the engine is then restarted or failed
                log.exception("engine supervisor: %s failed", job)
                self._supervisor_failed(job, e)

    def _supervisor_failed(self, job: str, e: Exception) -> None:
        """A bug in the supervisor's job: the engine's state can no longer be trusted, so it is
        killed (its exit restarts it as a crash would) or, if none runs, the client fails."""
        why = f"internal error in the engine supervisor ({job}): {e}"
        proc = self._proc
        if proc is not None and proc.popen.poll() is None:
            self.kill(reason=why)
        else:
            self._set_state("failed", why)

    def _spawn(self, *, restarted: bool, reload: P.Load | None = None) -> bool:
        if self._closing:  # a start queued before a shutdown: nothing to announce or spawn
            return False
        self._accepting.clear()
        self._set_state("starting", self.reason if restarted else "", restarted=restarted)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("GGML_NO_BACKTRACE", "1")  # no gdb attach on abort: crash fast, say why
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault(engine_log.ENV, engine_log.level_for_engine())  # its log lines: as ours would show
        # Spawned and published under the lock shutdown() takes to set _closing: a shutdown either
        # comes first (nothing is spawned) or finds the process and waits for it. Without this, a
        # shutdown that came while a start was queued returned at once and the engine it spawned
        # afterwards lived on beside the next one (the router's storm saw three engines, max two).
        with self._cond:
            closing = self._closing
            popen, failed = (None, "") if closing else self._popen(env)
            if popen is not None:
                self._gen += 1
                self.ready = None
                proc = self._proc = _Proc(popen=popen, gen=self._gen, last_seen=time.monotonic())
        if closing:  # shut down since the check above: its "stopped" stands, not our "starting"
            self._set_state("stopped", "")
            return False
        if popen is None:
            self._set_state("failed", failed)
            return False
        self.stderr_tail.clear()  # this process's last words only: an earlier one's must not explain its end
        stderr = proc.stderr = threading.Thread(target=self._read_stderr, args=(popen,), daemon=True,
                                                name="engine-stderr")
        stderr.start()
        threading.Thread(target=self._read_events, args=(proc,), daemon=True, name="engine-events").start()
        with self._cond:
            ok = self._cond.wait_for(lambda: self.ready is not None or popen.poll() is not None
                                     or self._closing, START_TIMEOUT_S)
            started = self.ready is not None
        if not started:
            with self._cond:
                self._proc = None  # its exit is not a crash to report
            if self._closing:  # shut down while starting: it goes now, not when the client does
                popen.kill()
                popen.wait()
                return False
            why = describe_exit(popen.poll()) if ok else f"no answer in {START_TIMEOUT_S:.0f} s"
            popen.kill()
            popen.wait()
            # Its last words, read to the end of the pipe first: on a loaded machine the stderr reader
            # may not have been scheduled yet when the exit was seen (the message lost its "boom").
            # A bounded wait: a grandchild holding the pipe open must not hold the supervisor.
            stderr.join(timeout=5.0)
            tail = " / ".join(list(self.stderr_tail)[-3:])
            self._set_state("failed", f"the engine did not start ({why}){': ' + tail if tail else ''}")
            return False
        if reload is not None:
            self._set_state("loading", self.reason, restarted=restarted)
            with self._cond:
                self._pending_load = reload
                self._reload_id = reload.id
            self._write(proc, reload)
        else:
            self._set_state("ready", self.reason, restarted=restarted)
        self._accepting.set()
        return True

    def _popen(self, env: dict[str, str]) -> tuple[subprocess.Popen[bytes] | None, str]:
        """The engine process, or None and why it could not be started."""
        try:
            # Its own session: a signal for the terminal's job (Ctrl-C, SIGTERM to the group, a
            # closed terminal) reaches this process, which stops the engine politely, instead of
            # killing the engine first, which looked like a crash and was restarted during a
            # normal shutdown. The engine never outlives this process (engine/link/lifeline.py).
            return subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, bufsize=0,
                                    start_new_session=os.name == "posix"), ""
        except OSError as e:
            return None, f"the engine could not be started: {e}"

    def _read_stderr(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stderr is not None
        try:
            for raw in popen.stderr:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    self.stderr_tail.append(line)
                    if not engine_log.relay(line):
                        log.debug("engine: %s", line)
        except (OSError, ValueError) as e:  # the pipe went away under us: the process is ending
            log.debug("engine stderr closed: %s", e)

    def _read_events(self, proc: _Proc) -> None:
        """The reader thread: one engine's events until its stdout closes, then its exit is reported.
        A line that breaks our handling is reported and skipped; the thread always reaches the end."""
        assert proc.popen.stdout is not None
        try:
            for raw in proc.popen.stdout:
                proc.last_seen = time.monotonic()
                proc.ping_out = 0.0
                try:
                    event = P.decode_event(raw)
                except P.ProtocolError as e:
                    log.warning("engine sent a bad line: %s", e)
                    continue
                if isinstance(event, P.Pong):
                    continue
                try:
                    self._handle(event)
                except Exception:  # one event we could not handle; the next ones still count
                    log.exception("could not handle the engine's %s event", event.TYPE)
        except (OSError, ValueError) as e:  # the pipe went away under us
            log.info("engine event pipe closed: %s", e)
        finally:
            try:
                proc.popen.wait()
                if proc.stderr is not None:  # its last words are read before its exit is reported
                    proc.stderr.join(timeout=5.0)  # (bounded: a grandchild may hold the pipe open)
                with self._cond:
                    self._cond.notify_all()  # a start waiting for Ready learns that it never comes
            finally:
                self._jobs.put(("exited", proc.gen))

    def _handle(self, event: P.Event) -> None:
        with self._cond:
            ended_load = self._note(event)  # the message of an error that ended the pending load
            if isinstance(event, (P.Done, P.Error, P.Embeddings, P.Tokenized)) and event.id is not None:
                self._inflight.discard(event.id)
                self._cancel_deadlines.pop(event.id, None)
            private = getattr(event, "id", None) in self._private
            if private and isinstance(event, (P.Done, P.Error, P.Embeddings, P.Tokenized)):
                self._results[event.id] = event  # type: ignore[index]
            self._cond.notify_all()
        if private:
            return  # a blocking embed() takes it
        self._deliver(event)  # then the state it leads to (a Lifecycle tells the whole story)
        self._state_after(event, ended_load)

    def _note(self, event: P.Event) -> str | None:
        """(Under the lock) what the event says of the engine: ready, loading, loaded, unloaded, or an
        error ending the pending load (its message is returned; otherwise None)."""
        if isinstance(event, P.Ready):
            self.ready = event
        elif isinstance(event, P.Loading):
            self._load_stage = event
        elif isinstance(event, P.Loaded):
            self.loaded = event
            self._good_load, self._pending_load = self._pending_load, None
            self._load_stage = None
            if event.id in self._waiting:
                self._results[event.id] = event
        elif isinstance(event, P.Unloaded):
            self.loaded = None
            self._good_load = None
        elif isinstance(event, P.Error):
            pending = self._pending_load
            if (pending is not None and event.id is not None and event.id == pending.id
                    and event.kind not in P.LOAD_NOTICE_KINDS):
                self._pending_load = self._load_stage = None
                if event.id in self._waiting:
                    self._results[event.id] = event
                return event.message
        return None

    def _state_after(self, event: P.Event, ended_load: str | None) -> None:
        """The client's state once a load ended (well or not) or the model was unloaded."""
        eid = getattr(event, "id", None)
        reloaded = eid is not None and eid == self._reload_id
        if isinstance(event, P.Loaded):
            self._set_state("loaded", "", restarted=reloaded)
        elif isinstance(event, P.Unloaded):
            self._set_state("ready", "")
        elif ended_load is not None:
            why = (f"the model could not be loaded again after the engine stopped "
                   f"({self._stop_reason}): {ended_load}") if reloaded else ""
            self._set_state("ready", why)
        if reloaded and (isinstance(event, P.Loaded) or ended_load is not None):
            self._reload_id = None

    def _deliver(self, event: P.Event) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("event listener failed")
        else:
            rid = getattr(event, "id", None)
            with self._cond:  # (under the lock: stream() may be moving this id's events right now)
                q = self._streams.get(rid) if rid is not None else None
                (q or self._queue).put(event)

    # ---- crash, hang and restart --------------------------------------------------------------

    def _exited(self) -> None:
        proc = self._proc
        if proc is None or self._closing:
            return
        self._accepting.clear()
        kind, reason, detail = self._why_it_stopped(proc)
        reason += self._rpc_loss(self._pending_load or self._good_load)
        with self._cond:
            inflight, self._inflight = sorted(self._inflight), set()
            self._cancel_deadlines.clear()
            crashed_load = self._pending_load  # cleared by the Error below, which ends the load
            stage, self._load_stage = self._load_stage, None
            good, was_loaded = self._good_load, self.loaded
            self.loaded = None
        reload: P.Load | None = None
        if crashed_load is not None:
            reload = self._fail_crashed_load(crashed_load, stage, good, kind, reason, detail)
        elif was_loaded is not None:
            reload = good
        restarting = self.auto_restart and self._may_restart()
        suffix = "; restarting" if restarting else ""
        message = (f"the engine stopped ({reason}){suffix}" if kind == "crash"
                   else f"{reason}; it was stopped{suffix}")
        for rid in inflight:
            self._handle(P.Error(kind=kind, id=rid, message=message, detail=detail))
        if crashed_load is None and not inflight:
            self._handle(P.Error(kind=kind, message=message, detail=detail))
        if not restarting:
            why = "the engine keeps stopping; not restarting it" if self.auto_restart else message
            self._set_state("failed", why)
            return
        self._stop_reason = reason
        lost = ""
        if reload is None and was_loaded is not None:
            lost = f"the model was unloaded when the engine stopped ({reason})"
        self.reason = lost
        self._spawn(restarted=True, reload=reload)

    def _why_it_stopped(self, proc: _Proc) -> tuple[P.ErrorKind, str, str]:
        """(kind, reason, stderr tail) of an engine process that is gone: killed as hung, or crashed
        (its exit status and the most telling stderr line)."""
        detail = "\n".join(self.stderr_tail)
        if proc.kill_reason:
            return "hung", proc.kill_reason, detail
        lines = [ln.strip() for ln in self.stderr_tail if ln.strip() and not engine_log.is_chatter(ln)]
        telling = [ln for ln in lines if re.search(r"GGML_ASSERT|error|what\(\)|terminate|abort", ln, re.I)]
        advice = next((a for cause, a in CAUSES if any(cause.search(ln) for ln in lines)), "")
        return "crash", describe_exit(proc.popen.poll()) + (f": {(telling or lines)[-1]}" if lines else "") \
            + (f"; {advice}" if advice else ""), detail

    def _fail_crashed_load(self, crashed_load: P.Load, stage: P.Loading | None, good: P.Load | None,
                           kind: P.ErrorKind, reason: str, detail: str) -> P.Load | None:
        """End a load the engine died in (blaming the file it was loading); returns what to reload:
        the model without its draft when the draft was to blame, else the last good load."""
        if stage is not None and stage.stage == "draft":
            what = f"the draft model {os.path.basename(stage.path)}"
            reload: P.Load | None = _without_draft(crashed_load, f"l{next(self._ids)}")
        elif stage is not None and stage.stage == "projector":
            what = f"the vision projector {os.path.basename(stage.path)}"
            reload = replace(crashed_load, id=f"l{next(self._ids)}", mmproj="")
        else:
            what = os.path.basename(crashed_load.model)
            reload = None if crashed_load is good else good
        verb = "llama.cpp crashed while loading" if kind == "crash" else "the engine hung loading"
        self._handle(P.Error(kind="load", id=crashed_load.id, detail=detail, message=(
            f"{verb} {what} ({reason})"
            + ("; loading the model without it" if reload is not None and stage is not None
               and stage.stage in ("draft", "projector") else ""))))
        return reload

    def _rpc_loss(self, load: P.Load | None) -> str:
        """With RPC workers: name the lost ones and reload without them, or say what is missing."""
        if load is None or not load.settings.rpc:
            return ""
        from ggufdesk.core.distributed import after_worker_loss

        note, settings = after_worker_loss(load.model, P.fields_of(load.settings))
        if note and self._good_load is not None:
            self._good_load = None if settings is None else replace(
                self._good_load, settings=LoadSettings(**settings))
        return f"; {note}" if note else ""

    def _may_restart(self) -> bool:
        now = time.monotonic()
        if len(self._restarts) == MAX_RESTARTS and now - self._restarts[0] < RESTART_WINDOW_S:
            return False
        self._restarts.append(now)
        return True

    def _watch(self) -> None:
        """Heartbeat and stop escalation (supervisor thread)."""
        proc = self._proc
        if proc is None or self._closing or proc.kill_reason or proc.popen.poll() is not None:
            return
        if self.state not in ("ready", "loading", "loaded"):
            return
        now = time.monotonic()
        with self._cond:
            late = [rid for rid, t in self._cancel_deadlines.items() if now >= t]
        if late:
            self.kill(reason=f"the engine did not stop within {self.cancel_grace:g} s when asked")
            return
        if proc.ping_out and now - proc.last_seen >= self.hang_timeout:
            self.kill(reason=f"the engine stopped responding (no answer in {self.hang_timeout:g} s)")
            return
        if not proc.ping_out and now - proc.last_seen >= self.ping_interval:
            proc.ping_out = now
            self._outbox.put(P.Ping(id=f"p{next(self._ids)}"))

    # ---- sending ------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        """The writer thread: requests leave in order; a caller never waits for the pipe or a restart.
        Whatever goes wrong with one request ends that request with an error, never this thread."""
        while True:
            msg = self._outbox.get()
            if msg is None:
                return
            try:
                self._write_one(msg)
            except Exception as e:  # one request fails, the writer goes on
                log.exception("engine writer: could not send %s", msg.TYPE)
                self._failed_request(msg, "bug", f"internal error sending the request to the engine: {e}")

    def _write_one(self, msg: P.Request) -> None:
        while not self._accepting.wait(0.5):
            if self.state in ("failed", "stopped") or self._closing:
                break
        proc = self._proc
        if self._accepting.is_set() and proc is not None and self._write(proc, msg):
            return
        self._undeliverable(msg)

    def _write(self, proc: _Proc, msg: P.Request) -> bool:
        try:
            data = P.encode(msg).encode("utf-8")
        except (ValueError, TypeError) as e:  # (RecursionError is turned into ValueError by encode)
            log.warning("a %s request cannot be sent to the engine: %s", msg.TYPE, e)
            self._failed_request(msg, "protocol", f"the request cannot be passed to the engine: {e}")
            return True
        stdin = proc.popen.stdin
        assert stdin is not None
        with self._write_lock:
            try:
                stdin.write(data)
                stdin.flush()
                return True
            except (BrokenPipeError, OSError, ValueError) as e:
                log.info("engine pipe closed while writing %s: %s", msg.TYPE, e)
                return True  # the process is gone: its exit reports what was in flight

    def _undeliverable(self, msg: P.Request) -> None:
        """The engine is down for good: a request that expects an answer gets one."""
        self._failed_request(msg, "crash", self._not_running())

    def _failed_request(self, msg: P.Request, kind: P.ErrorKind, message: str) -> None:
        """A request that expects an answer (Generate, Load, Embed) gets this error as its answer."""
        rid = getattr(msg, "id", None)
        if isinstance(msg, (P.Generate, P.Load, P.Embed, P.Tokenize)) and rid is not None:
            self._handle(P.Error(kind="load" if isinstance(msg, P.Load) else kind, id=rid, message=message))

    def _not_running(self) -> str:
        return "the engine is not running" + (f": {self.reason}" if self.reason else "")

    def _send(self, msg: P.Request) -> None:
        """Queue a request for the writer thread; raises only when the engine is gone for good."""
        if self.state in ("failed", "stopped") or self._closing:
            raise KnownError(self._not_running())
        self._outbox.put(msg)

    # ---- requests -----------------------------------------------------------------------------

    def load(
        self,
        model: str,
        *,
        settings: LoadSettings | dict[str, Any] | None = None,
        speculation: SpeculationSettings | dict[str, Any] | None = None,
        draft: str | None = None,
        mmproj: str | None = None,
        wait: bool = True,
        timeout: float = 600.0,
    ) -> P.Loaded | None:
        """Load a model (mmproj: its vision projector; None: the one beside it, "": none); with wait=True
        return the Loaded event or
        raise EngineError. Any error the engine gives for this load, other than a template, draft or
        projector notice, fails it."""
        lid = f"l{next(self._ids)}"
        msg = P.Load(id=lid, model=str(model), settings=P.settings_of(LoadSettings, settings), draft=draft,
                     speculation=P.settings_of(SpeculationSettings, speculation),
                     mmproj=None if mmproj is None else str(mmproj))
        if self.state in ("failed", "stopped") or self._closing:
            raise KnownError(self._not_running())
        with self._cond:
            self.loaded = None
            self._pending_load = msg
            self._load_stage = None
            if wait:
                self._waiting.add(lid)
        self._set_state("loading", "")
        self._outbox.put(msg)
        if not wait:
            return None
        with self._cond:
            self._cond.wait_for(lambda: lid in self._results, timeout)
            result = self._results.pop(lid, None)
            self._waiting.discard(lid)
        if isinstance(result, P.Loaded):
            return result
        raise EngineError(result if isinstance(result, P.Error) else P.Error(kind="load", id=lid, message=(
            f"the model did not load in {timeout:.0f} s")))

    def generate(
        self,
        *,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        sampling: SamplingSettings | dict[str, Any] | None = None,
        speculation: SpeculationSettings | dict[str, Any] | None = None,
        request_id: str | None = None,
        logprobs: int = 0,
        **extra: Any,
    ) -> str:
        """Start a generation; returns its request id (events follow). `extra` are further
        Generate fields (grammar, json_schema, tools, ...), passed as they are."""
        if self.state == "ready" and self.reason:
            raise KnownError(f"no model is loaded: {self.reason}")
        rid = request_id or f"r{next(self._ids)}"
        msg = P.Generate(id=rid, prompt=prompt, messages=messages, sampling=P.settings_of(SamplingSettings, sampling),
                         speculation=P.fields_of(speculation) if speculation is not None else None,
                         logprobs=logprobs, **extra)
        return self._send_tracked(rid, msg)

    def _send_tracked(self, rid: str, msg: P.Generate | P.Embed) -> str:
        """Send a request that is in flight until its Done, Embeddings or Error (or a crash) ends it."""
        with self._cond:
            self._inflight.add(rid)
        try:
            self._send(msg)
        except KnownError:
            with self._cond:
                self._inflight.discard(rid)
            raise
        return rid

    def start_embed(self, inputs: list[str | list[int]], *, truncate: bool = False,
                    request_id: str | None = None) -> str:
        """Ask for the embeddings of `inputs` (texts or token id lists); returns the request id. Its
        Embeddings event (one unit-length vector per input, in order) or Error follows."""
        rid = request_id or f"e{next(self._ids)}"
        msg = P.Embed(id=rid, inputs=list(inputs), truncate=truncate)
        return self._send_tracked(rid, msg)

    def _ask(self, msg: P.Embed | P.Tokenize, timeout: float) -> P.Event:
        """Send a request and wait for the event that ends it (with or without on_event: the answer
        goes to this caller only). Raises EngineError for an Error, KnownError when it never comes."""
        rid = msg.id
        with self._cond:
            self._private.add(rid)
            self._inflight.add(rid)
        try:
            self._send(msg)
            with self._cond:
                done = self._cond.wait_for(lambda: rid in self._results, timeout)
                result = self._results.pop(rid, None)
            if not done:
                self.cancel(rid)
                raise KnownError(f"no answer from the engine in {timeout:.0f} s")
        finally:
            with self._cond:
                self._private.discard(rid)
                self._inflight.discard(rid)
        if isinstance(result, P.Error):
            raise EngineError(result)
        assert result is not None
        return result

    def embeddings(self, inputs: list[str | list[int]], *, truncate: bool = False,
                   timeout: float = 600.0) -> P.Embeddings:
        """The Embeddings event for `inputs`, blocking (with or without on_event). Raises EngineError
        when the engine refuses or fails them, KnownError when it is down, cancelled or too slow."""
        result = self._ask(P.Embed(id=f"e{next(self._ids)}", inputs=list(inputs), truncate=truncate), timeout)
        if not isinstance(result, P.Embeddings):
            raise KnownError("the embedding request was cancelled")
        return result

    def tokenize(self, *, text: str | None = None, messages: list[dict[str, Any]] | None = None,
                 tokens: list[int] | None = None, timeout: float = 60.0, **options: Any) -> P.Tokenized:
        """Tokens of `text`, or of the chat prompt for `messages` (rendered as a generation renders it;
        `tools`, `tool_choice` in options), or the text of `tokens` (detokenize). Options are the other
        Tokenize fields (add_special, parse_special, with_pieces). Blocking; raises EngineError."""
        msg = P.Tokenize(id=f"t{next(self._ids)}", text=text, messages=messages, tokens=tokens, **options)
        result = self._ask(msg, timeout)
        if not isinstance(result, P.Tokenized):
            raise KnownError("the tokenize request was cancelled")
        return result

    def embed(self, texts: list[str], *, truncate: bool = False, timeout: float = 600.0) -> list[list[float]]:
        """One unit-length embedding vector per text, in order (the loaded model's pooling; mean for a
        chat model). Deterministic, and a text's vector does not depend on the others in the call."""
        return self.embeddings(list(texts), truncate=truncate, timeout=timeout).vectors

    def cancel(self, rid: str) -> None:
        """Ask the engine to stop rid; if it has not ended within `cancel_grace` seconds, the engine
        is killed and restarted (a runaway template render cannot be interrupted any other way)."""
        with self._cond:
            if rid in self._inflight:  # (a cancel may also come first: the engine remembers it)
                self._cancel_deadlines.setdefault(rid, time.monotonic() + self.cancel_grace)
        if self.state not in ("failed", "stopped"):
            self._outbox.put(P.Cancel(id=rid))

    def unload(self) -> None:
        self._send(P.Unload(id=f"u{next(self._ids)}"))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask the engine to exit; terminate, then kill, if it does not. Blocks up to `timeout`."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        proc = self._proc
        self._outbox.put(None)
        if proc is not None and proc.popen.poll() is None:
            popen = proc.popen
            with self._write_lock:
                try:
                    assert popen.stdin is not None
                    popen.stdin.write(P.encode(P.Shutdown()).encode("utf-8"))
                    popen.stdin.close()
                except (OSError, ValueError):
                    pass
            try:
                popen.wait(timeout)
            except subprocess.TimeoutExpired:
                procs.terminate(popen, 2.0)
        # Only now: the supervisor spawned the engine, and its end sends the parent-death signal.
        self._jobs.put(("close", 0))
        if self.state != "stopped":
            self._set_state("stopped", "")

    def kill(self, reason: str = "") -> None:
        """SIGKILL the engine (a hard stop; the watchdog). The client reports it like a crash, with
        `reason` when given, and restarts it when auto_restart is on."""
        proc = self._proc
        if proc is not None and proc.popen.poll() is None:
            proc.kill_reason = reason
            proc.popen.kill()

    # ---- receiving (without on_event) ---------------------------------------------------------

    def events(self, timeout: float | None = None) -> Iterator[P.Event]:
        """Queued events as they come; stops after `timeout` seconds of silence."""
        while True:
            try:
                yield self._queue.get(timeout=timeout)
            except queue.Empty:
                return

    def stream(self, rid: str, timeout: float = 600.0) -> Iterator[P.Event]:
        """Events of request rid, ending with its Done or Error (several streams may run at once)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            # from now on rid's events go to a queue of its own, so other streams (and events())
            # never take them; what already arrived moves there, the rest stays in order
            own = self._streams.get(rid)
            if own is None:
                own = self._streams[rid] = queue.Queue()
                rest: list[P.Event] = []
                while True:
                    try:
                        ev = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if getattr(ev, "id", None) == rid:
                        own.put(ev)
                    else:
                        rest.append(ev)
                for ev in rest:
                    self._queue.put(ev)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KnownError(f"no answer from the engine in {timeout:.0f} s")
                try:
                    event = own.get(timeout=left)
                except queue.Empty:
                    continue
                if getattr(event, "id", None) != rid:
                    continue
                yield event
                if isinstance(event, (P.Done, P.Error)):
                    return
        finally:
            with self._cond:
                self._streams.pop(rid, None)

    def __enter__(self) -> EngineClient:
        if self.state == "stopped":
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _without_draft(load: P.Load, lid: str) -> P.Load:
    mode = "off" if load.speculation.mode == "draft" else load.speculation.mode
    spec = replace(load.speculation, mode=mode, draft_model=None)
    return P.Load(id=lid, model=load.model, settings=load.settings, draft=None, speculation=spec, mmproj=load.mmproj)
