"""Run the engine's decode probe (engine/runtime/decode_probe.py) in its own process and keep its figures.

llama.cpp loads only in an engine process, so the probe is one: a short-lived `python -m` child whose
last line of output is one JSON object. Whatever goes wrong (no llama.cpp, a full disk for its models, a
crash, a hang) ends as a KnownError with the reason, and nothing is recorded: the planner keeps its
fitted constants, or the figures of an earlier probe.
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ggufdesk.core import hardware
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.decode_probe")
COMMAND = [sys.executable, "-m", "ggufdesk.engine.runtime.decode_probe"]
PROBE_DIRS = "ggufdesk-probe-*"  # the runtime's temporary folders (decode_probe.run)
TIMEOUT_S = 300.0  # about 50 s on a 2-core machine; a hang must still end


def measure(*, folder: Path | None = None, timeout: float = TIMEOUT_S, command: list[str] | None = None,
            min_bytes: int | None = None) -> dict[str, Any]:
    """The probe's result (rates, times); KnownError when it could not measure. min_bytes: smaller
    models than the probe's (tests: its results then say little about the machine)."""
    folder = folder or hardware.cache_dir()
    args = [*(command or COMMAND), str(folder), *([str(min_bytes)] if min_bytes is not None else [])]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise KnownError(f"the decode probe did not finish in {timeout:.0f} s; nothing was recorded") from None
    except OSError as e:
        raise KnownError(f"the decode probe could not start: {e}") from None
    finally:  # a probe killed (a timeout, a crash) leaves its models behind: up to 1 GB each
        for left in folder.glob(PROBE_DIRS) if folder.is_dir() else ():
            shutil.rmtree(left, ignore_errors=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = " / ".join(p.stderr.strip().splitlines()[-2:])
        raise KnownError(f"the decode probe ended without a result (exit {p.returncode}){': ' + tail if tail else ''}")
    if "error" in result:
        raise KnownError(f"the decode probe failed: {result['error']}")
    return result


def run_and_record(**kw: Any) -> dict[str, Any]:
    """Measure and keep the figures for the planner (hardware.record_decode_probe)."""
    result = measure(**kw)
    try:
        hardware.record_decode_probe(result)
    except ValueError as e:
        raise KnownError(str(e)) from None
    return result


def needed() -> bool:
    """Whether ensure() would measure: no figures for this machine, an earlier version's (without a
    weight type the probe now times), or figures taken with another llama.cpp build."""
    have = hardware.decode_probe()
    return not (have is not None and set(hardware.DECODE_PROBE_TYPES) <= set(have.get("type_gbs") or ())
                and hardware.decode_probe_is_current())


def ensure(**kw: Any) -> dict[str, Any] | None:
    """The recorded figures, measuring them first when this machine has none, when they lack a weight
    type the probe now times (an earlier version's probe), or when they were taken with another
    llama.cpp build; None (logged) when the probe fails: a prediction from the fitted constants, or
    from the earlier figures, is still a prediction."""
    have = hardware.decode_probe()
    if not needed():
        return have
    try:
        run_and_record(**kw)
    except KnownError as e:
        log.warning("%s", e)
        return have
    return hardware.decode_probe()
