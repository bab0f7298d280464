"""No engine outlives its client, and the engine answers heartbeats while it decodes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import psutil
import pytest

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.lifeline import PARENT_ENV, parent_is_gone
from tests.engine.conftest import TINY_LOAD


def gone(pid: int, timeout: float = 30.0) -> bool:
    """Wait until pid has exited (a zombie nobody reaped counts as exited)."""
    try:
        proc = psutil.Process(pid)
        proc.wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return proc.status() == psutil.STATUS_ZOMBIE
    return True


def test_the_engine_dies_when_its_client_is_killed():
    script = textwrap.dedent("""
        import sys, time
        from ggufdesk.engine.link.client import EngineClient
        c = EngineClient()
        c.start()
        print(c.pid, flush=True)
        time.sleep(600)
    """)
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        engine_pid = int(client.stdout.readline())
        assert psutil.pid_exists(engine_pid)
        client.kill()  # SIGKILL: no shutdown, no atexit, nothing
        client.wait(30)
        assert gone(engine_pid), "the engine outlived its client"
    finally:
        client.kill()


def worker() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ggufdesk.engine.runtime.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)


def send(proc: subprocess.Popen, msg) -> None:
    proc.stdin.write(P.encode(msg))
    proc.stdin.flush()


def until(proc: subprocess.Popen, want) -> list:
    seen = []
    for line in proc.stdout:
        ev = P.decode(line)
        seen.append(ev)
        if want(ev):
            return seen
    raise AssertionError(f"the engine ended first: {seen!r}")


def test_ping_is_answered_while_a_generation_runs_and_eof_ends_the_engine(tiny_model):
    proc = worker()
    try:
        until(proc, lambda ev: isinstance(ev, P.Ready))
        send(proc, P.Load(id="l1", model=str(tiny_model), settings=TINY_LOAD))
        until(proc, lambda ev: isinstance(ev, P.Loaded) and ev.id == "l1")
        send(proc, P.Generate(id="g1", prompt="the cat", sampling=SamplingSettings(temperature=0, max_tokens=400)))
        until(proc, lambda ev: isinstance(ev, P.Token))
        send(proc, P.Ping(id="p1"))
        seen = until(proc, lambda ev: isinstance(ev, (P.Pong, P.Done)))
        assert isinstance(seen[-1], P.Pong) and seen[-1].id == "p1"  # answered mid-generation
        proc.stdin.close()  # the client is gone: the engine stops the generation and exits
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_a_protocol_error_names_no_request_and_the_engine_goes_on():
    proc = worker()
    try:
        until(proc, lambda ev: isinstance(ev, P.Ready))
        proc.stdin.write(json.dumps({"type": "error", "kind": "nonsense", "message": "x"}) + "\n")
        proc.stdin.flush()
        proc.stdin.buffer.write(b"\xff\xfe{ not UTF-8, not JSON\n")  # binary garbage
        proc.stdin.buffer.flush()
        err = until(proc, lambda ev: isinstance(ev, P.Error))[-1]
        assert err.kind == "protocol" and "nonsense" in err.message
        err = until(proc, lambda ev: isinstance(ev, P.Error))[-1]
        assert err.kind == "protocol" and "not JSON" in err.message
        send(proc, P.Ping(id="alive"))
        assert until(proc, lambda ev: isinstance(ev, P.Pong))[-1].id == "alive"
    finally:
        proc.kill()


def test_parent_is_gone_compares_the_parent_pid():
    import os

    assert not parent_is_gone({PARENT_ENV: str(os.getppid())})
    assert parent_is_gone({PARENT_ENV: str(os.getppid() + 100000)})
    assert not parent_is_gone({})  # started by hand: nothing to compare


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_parent_death_signal_is_set_without_running_a_program():
    """find_library ran `ldconfig -p` at every engine start: a child of the engine that the router's
    storm test counted as a third engine beside two."""
    code = ("import ctypes.util, subprocess\n"
            "def no(*a, **k): raise AssertionError('ran a program')\n"
            "ctypes.util.find_library = no; subprocess.Popen = no\n"
            "from ggufdesk.engine.link.lifeline import set_parent_death_signal\n"
            "raise SystemExit(0 if set_parent_death_signal() else 3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
