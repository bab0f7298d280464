"""A live `ggufdesk serve` (or an in-process server over the fake engine) for the server tests."""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

from ggufdesk.core import procs
from ggufdesk.server.admission import Admission
from ggufdesk.server.pool import EnginePool
from ggufdesk.server.runner import ServerRunner
from ggufdesk.server.service import ServerConfig, Service

ROOT = Path(__file__).resolve().parents[2]
FAKE_ENGINE = [sys.executable, str(ROOT / "tests" / "fixtures" / "fake_engine.py")]


class ServeProcess:
    """`python -m ggufdesk serve MODEL [MODEL ...] --port 0 ...` as a child; waits for its 'ready' line."""

    def __init__(self, model: Path | str | list[Path | str], *args: str, home: Path, timeout: float = 120.0,
                 preexec_fn=None) -> None:
        env = dict(os.environ)
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
            env[var] = str(home / var.lower())
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ggufdesk", "serve", *map(str, model if isinstance(model, list) else [model]),
             "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT),
            preexec_fn=preexec_fn,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._collect, daemon=True).start()
        self.url = ""
        self.output: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"serve did not get ready in {timeout} s: {self.output} {self.stderr[-5:]}") from None
            if line is None:
                self.proc.wait()
                raise RuntimeError(f"serve exited ({self.proc.returncode}): {self.output} {self.stderr[-5:]}")
            self.output.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
            if "ready:" in line:
                return

    @staticmethod
    def _pump(stream, q: queue.Queue) -> None:
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def _collect(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def stop(self) -> None:
        procs.terminate(self.proc, 10)


def fake_pool(model: str = "/models/fake-model.gguf", *, n_ctx: int = 512, **kwargs) -> EnginePool:
    """An EnginePool over tests/fixtures/fake_engine.py (no llama.cpp): fast and scriptable."""
    from ggufdesk.core.settings import LoadSettings
    from ggufdesk.engine.link.client import EngineClient

    env = dict(os.environ, **{k: str(v) for k, v in kwargs.pop("env", {}).items()})
    return EnginePool(model=model, load=LoadSettings(n_ctx=n_ctx),
                      client_factory=lambda **kw: EngineClient(command=FAKE_ENGINE, env=env, **kw), **kwargs)


class InProcess:
    """A server on a thread of this process over the fake engine."""

    def __init__(self, *, env: dict | None = None, load: bool = True, n_ctx: int = 512, **config) -> None:
        memory = config.pop("memory_check", lambda: None)
        self.pool = fake_pool(env=env or {}, n_ctx=n_ctx)
        cfg = ServerConfig(**config)
        self.svc = Service(pool=self.pool, config=cfg,
                           admission=Admission(slots=cfg.parallel, max_queue=cfg.max_queue, memory_check=memory))
        self.runner = ServerRunner(self.svc, port=0)
        self.url = self.runner.start_thread()
        if load:
            self.pool.start()

    def close(self) -> None:
        self.runner.stop()
        self.pool.shutdown()
