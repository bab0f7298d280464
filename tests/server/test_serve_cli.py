"""`ggufdesk serve` refusals: exposure without a key, a model that does not load, a port in use."""
from __future__ import annotations

import socket
import subprocess
import sys

from tests.server.serving import ROOT


def serve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ggufdesk", "serve", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


def test_listening_beyond_this_machine_needs_an_api_key(tiny_model):
    r = serve(str(tiny_model), "--host", "0.0.0.0", "--port", "0")
    assert r.returncode == 1
    assert "refusing to listen on 0.0.0.0 without an API key" in r.stderr and "--api-key" in r.stderr


def test_a_model_that_does_not_load_stops_the_server_with_the_reason(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but not really")
    r = serve(str(bad), "--port", "0")
    assert r.returncode == 1
    assert "listening on http://127.0.0.1:" in r.stdout
    assert "the model did not load" in r.stderr


def test_a_port_in_use_is_a_clear_error(tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = serve(str(tiny_model), "--port", str(port))
    assert r.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in r.stderr


def test_nonsense_numbers_are_refused_before_anything_starts(tiny_model):
    r = serve(str(tiny_model), "--port", "0", "--prefill-chunk", "-5")
    assert r.returncode == 1 and "--prefill-chunk cannot be negative" in r.stderr
    assert "listening" not in r.stdout


def test_sigterm_to_the_terminals_job_is_a_normal_shutdown(tiny_model):
    """SIGTERM to the process group (as a terminal or a service manager sends it) logged 'the
    engine stopped (killed by SIGTERM); restarting' and restarted the engine."""
    import os
    import signal
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "ggufdesk", "serve", str(tiny_model), "--port", str(port),
                          "--ctx", "512"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert "restarting" not in err and "engine stopped" not in err, err
    assert "stopped" in out + err  # said it stopped, as on Ctrl-C
