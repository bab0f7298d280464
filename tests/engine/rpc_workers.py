"""Start `ggufdesk worker` processes on free loopback ports for tests and benchmarks."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass
class Worker:
    proc: subprocess.Popen
    endpoint: str

    def kill(self) -> None:
        """SIGKILL the worker command and its server (its own process group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: the worker stops answering but keeps its connections open."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_worker(*, mem: int = 0, threads: int = 1, tries: int = 3) -> Worker:
    """A worker on a free port; returns once it answers (it prints its endpoint when it does).
    The port is picked free and then bound by the server: another process may take it in
    between, so a failed start is retried on a new port."""
    for attempt in range(tries):
        try:
            return _start(mem, threads)
        except RuntimeError:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _start(mem: int, threads: int) -> Worker:
    cmd = [sys.executable, "-c", "import sys; from ggufdesk.cli import main; sys.exit(main())",
           "worker", "--port", "0", "--threads", str(threads)] + (["--mem", str(mem)] if mem else [])
    log = tempfile.TemporaryFile()  # llama.cpp prints a line per connection: never a pipe that fills
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    line = proc.stdout.readline().decode()
    if "listening on" not in line:
        proc.wait(10)
        log.seek(0)
        raise RuntimeError(f"worker did not start: {line} {log.read().decode()[-2000:]}")
    endpoint = line.split("--rpc ")[1].strip()
    return Worker(proc=proc, endpoint=endpoint)
