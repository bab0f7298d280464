"""`ggufdesk run` tells the CPU threads decoding (engine/batching/threads.py), fixed when --threads says so."""
from __future__ import annotations

import json

from tests.cli.test_run_chat import ggufdesk


def test_run_reports_the_threads_and_a_fixed_count_stays(tiny_model):
    p = ggufdesk("run", str(tiny_model), "--prompt", "hello the cat", "--max-tokens", "5", "--temperature", "0",
                 "--ctx", "256", "--threads", "1", "--threads-batch", "1", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["threads"] == 1
    p = ggufdesk("run", str(tiny_model), "--prompt", "hello the cat", "--max-tokens", "5", "--temperature", "0",
                 "--ctx", "256", "--threads", "1", "--threads-batch", "1")
    assert p.returncode == 0 and "decode" in p.stderr and "(1 thread)" in p.stderr, p.stderr
