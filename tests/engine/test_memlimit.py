"""The engine's memory ceiling (engine/runtime/memlimit.py): derived from the plan, set before each load,
and it turns a runaway allocation into a MemoryError instead of eating the machine."""
from __future__ import annotations

import subprocess
import sys

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.runtime import memlimit
from tests.engine.conftest import TINY_LOAD
from tests.engine.helpers import collect, greedy


def _soft_data_limit(pid: int) -> str:
    line = next(x for x in open(f"/proc/{pid}/limits") if x.startswith("Max data size"))
    return line.split()[3]


def _vm_data(pid: int) -> int:
    line = next(x for x in open(f"/proc/{pid}/status") if x.startswith("VmData:"))
    return int(line.split()[1]) * 1024


def test_engine_runs_under_a_limit_from_the_plan(engine, tiny_model):
    pid = engine.ready.pid
    limit = int(_soft_data_limit(pid))
    plan = memlimit.planned_bytes(str(tiny_model), TINY_LOAD, None)
    assert _vm_data(pid) < limit and limit >= plan + memlimit.MARGIN_MIN
    r = collect(engine, engine.generate(prompt="hello the cat", sampling=greedy(8)))
    assert r.error is None and r.done.finish_reason == "length"


def test_gpu_loads_and_unreadable_models_get_no_limit(tiny_model, tmp_path):
    assert memlimit.limit_for(str(tiny_model), LoadSettings(n_gpu_layers=-1)) is None
    assert memlimit.limit_for(str(tmp_path / "missing.gguf"), LoadSettings()) is None
    assert memlimit.limit_for(str(tiny_model), LoadSettings()) > memlimit.data_bytes()


def test_the_ceiling_turns_a_runaway_allocation_into_memory_error():
    code = ("from ggufdesk.engine.runtime import memlimit\n"
            "memlimit.apply(memlimit.data_bytes() + (256 << 20))\n"
            "try:\n    b = bytearray(1 << 30)\nexcept MemoryError:\n    print('refused')\n"
            "small = bytearray(16 << 20)\nprint('ok', len(small))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["refused", "ok", str(16 << 20)], p.stderr
