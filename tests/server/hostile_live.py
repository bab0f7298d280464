"""Watching a live server while a hostile client works on it: /health's answer times, a normal request, log bytes.

The acceptance figures of issue 34 (/health within 1 s, a normal request answered, logs under 1 MB) are
taken here. Assertions use generous deadlines that catch real hangs only (the machine may be busy);
the observed figures are recorded with `record()` and, when GGUFDESK_FIGURES names a file, appended
to it as JSON lines for docs/bench/hostile.md.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import psutil

MODEL = "tiny-target"
HANG_S = 30.0  # an answer slower than this is a hang, not a busy machine
NORMAL = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def record(case: str, **figures: Any) -> None:
    """Keep an observed figure for the report (printed; appended to $GGUFDESK_FIGURES when set)."""
    line = json.dumps({"case": case, **figures})
    print("figures:", line)
    path = os.environ.get("GGUFDESK_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@dataclass
class Watch:
    """/health asked over and over from a thread; each answer's time and status kept."""

    url: str
    health_s: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(HANG_S + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=HANG_S) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    status = c.get(self.url + "/health").status_code
                except httpx.HTTPError:
                    status = 0
                self.health_s.append(time.perf_counter() - t0)
                self.statuses.append(status)
                self._stop.wait(0.05)

    @property
    def worst_s(self) -> float:
        return max(self.health_s, default=0.0)


def normal_request(url: str, headers: dict[str, str] | None = None) -> tuple[int, float]:
    """A small chat request: its status and how long it took."""
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=NORMAL, headers=headers or {}, timeout=HANG_S * 4)
    return r.status_code, time.perf_counter() - t0


@dataclass
class Outcome:
    """What happened while one hostile action ran."""

    result: Any
    hostile_s: float
    worst_health_s: float
    health_asked: int
    normal_status: int
    normal_s: float


def during(url: str, hostile: Callable[[], Any], *, headers: dict[str, str] | None = None,
           settle_s: float = 0.3) -> Outcome:
    """Run `hostile` on a thread; meanwhile watch /health and, once it has had `settle_s` to get going, send
    a normal request. Returns when both are over (the hostile action is given HANG_S * 4 at most)."""
    box: dict[str, Any] = {}

    def run() -> None:
        t0 = time.perf_counter()
        try:
            box["result"] = hostile()
        except Exception as e:  # noqa: BLE001 - reported as the outcome
            box["result"] = e
        box["s"] = time.perf_counter() - t0

    t = threading.Thread(target=run, daemon=True)
    with Watch(url) as w:
        t.start()
        time.sleep(settle_s)
        status, normal_s = normal_request(url, headers)
        t.join(HANG_S * 4)
        time.sleep(0.2)
    return Outcome(result=box.get("result"), hostile_s=box.get("s", float("inf")), worst_health_s=w.worst_s,
                   health_asked=len(w.health_s), normal_status=status, normal_s=normal_s)


def engine_pids(server_pid: int) -> set[int]:
    """The engine processes under a `ggufdesk serve` process."""
    try:
        kids = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    out = set()
    for k in kids:
        try:
            if any("ggufdesk.engine" in part for part in k.cmdline()):
                out.add(k.pid)
        except psutil.Error:
            pass
    return out


def log_bytes(server: Any) -> int:
    """Bytes the server process has written to stderr so far (its log)."""
    return sum(len(line) + 1 for line in list(server.stderr))
