"""`ggufdesk worker`: loopback by default, remote only when asked (with a warning), and it always stops."""
from __future__ import annotations

import os
import signal
import socket

import psutil
import pytest

from ggufdesk.cli import main
from ggufdesk.cli.worker import is_loopback
from ggufdesk.core import rpc_wire
from tests.engine.rpc_workers import start_worker

pytestmark = pytest.mark.timeout(120)


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.2", "example.org", "::"))


def test_a_non_loopback_address_needs_allow_remote(capsys):
    assert main(["worker", "--host", "192.0.2.1"]) == 1
    err = capsys.readouterr().err
    assert "--allow-remote" in err and "no authentication" in err


def test_allow_remote_warns_before_anything_listens(capsys):
    # 192.0.2.1 (TEST-NET-1) is on no interface here: the warning comes, then a clear refusal
    assert main(["worker", "--host", "192.0.2.1", "--port", "50999", "--allow-remote"]) == 1
    err = capsys.readouterr().err
    assert "WARNING" in err and "no authentication and no encryption" in err and "SSH tunnel" in err
    assert "cannot listen on 192.0.2.1:50999" in err


def test_a_taken_port_is_refused(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert main(["worker", "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_bad_rpc_lists_are_refused_before_anything_starts(capsys):
    assert main(["run", "--prompt", "x", "--rpc", "nohost"]) == 1
    assert "host:port" in capsys.readouterr().err


def test_terminate_stops_the_server_too():
    w = start_worker(mem=64 << 20)
    info = rpc_wire.probe_worker(w.endpoint)
    assert info.devices == [(64 << 20, 64 << 20)]  # --mem is what clients are told
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(30) == 0
    assert not rpc_wire.reachable(w.endpoint)


def test_a_killed_worker_command_takes_its_server_with_it():
    w = start_worker()
    server = psutil.Process(w.proc.pid).children()
    assert len(server) == 1
    os.kill(w.proc.pid, signal.SIGKILL)  # the command only, not its process group
    w.proc.wait()
    gone, alive = psutil.wait_procs(server, timeout=30)
    assert gone and not alive
    assert not rpc_wire.reachable(w.endpoint)


def test_run_and_chat_use_the_workers(tiny_model, capsys):
    import io
    import json

    from ggufdesk.cli import build_parser
    from ggufdesk.cli.chat import run as chat_run

    w = start_worker()
    try:
        small = ["--ctx", "512", "--batch", "64", "--ubatch", "64", "--threads", "1", "--rpc", w.endpoint]
        assert main(["run", str(tiny_model), "--prompt", "the cat", "--max-tokens", "4", "--temperature", "0",
                     "--json", *small]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["tokens"] == 4 and out["rpc"]["devices"][0]["endpoint"] == w.endpoint
        assert out["rpc"]["n_gpu_layers"] == 3 and out["rpc"]["cpu_layers"] == 0  # all on the worker
        args = build_parser().parse_args(["chat", str(tiny_model), "--max-tokens", "3", *small])
        screen = io.StringIO()
        assert chat_run(args, stdin=io.StringIO("hello\n/exit\n"), stdout=screen) == 0
        assert f"spread over {w.endpoint}: 3 layers, this machine: 0 layers" in screen.getvalue()
    finally:
        w.stop()
