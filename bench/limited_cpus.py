"""Decode speed where the process may use fewer CPUs than the machine has: a container's CPU quota
(`docker run --cpus 1`, a cgroup's `cpu.max` / `cpu.cfs_quota_us`) or an affinity mask (`taskset`,
`--cpuset-cpus`). The default thread count (core/settings.py `default_threads`, core/cpus.py) against
fixed 1 and fixed 2 threads (and, for reference, the same without a limit), each a one-shot
`ggufdesk run --json` of the starter (greedy, free writing), interleaved, the order rotating from round
to round.

llama.cpp's threads spin-wait for each other: two threads on one CPU take turns, which does not
collapse a decode as a busy neighbour does (engine/batching/threads.py), but measured here cost 13-37%
(docs/bench/engine.md). Printed: median decode tok/s per limit and
thread setting, and default / the better fixed choice (>= 0.9 is the contention bench's bar).

The quota needs a writable cgroup (root, cgroup v1 `cpu` or v2 with the cpu controller); where none
can be made that limit is skipped and says so.

    .venv/bin/python bench/limited_cpus.py [--rounds 3] [--tokens 128] [--model PATH]
        [--limits none,affinity,quota] [--python PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ggufdesk.core.starter import starter_model_path

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n"
SETTINGS = {"default": 0, "fixed 1": 1, "fixed 2": 2}  # --threads (0: the engine's default)


@contextlib.contextmanager
def quota_cgroup(cpus: float) -> Iterator[Path | None]:
    """A cgroup limited to `cpus` CPUs (v1 cpu or v2), removed after; None where none can be made."""
    name = f"ggufdesk-bench-{uuid.uuid4().hex[:8]}"
    for base, files in ((Path("/sys/fs/cgroup/cpu"), "v1"), (Path("/sys/fs/cgroup"), "v2")):
        d = base / name
        try:
            d.mkdir()
        except OSError:
            continue
        try:
            if files == "v1":
                (d / "cpu.cfs_period_us").write_text("100000")
                (d / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
            else:
                (d / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
        except OSError:
            d.rmdir()
            continue
        try:
            yield d
        finally:
            with contextlib.suppress(OSError):
                d.rmdir()
        return
    yield None


def one(python: str, model: str, threads: int, tokens: int, limit: str, cgroup: Path | None) -> tuple[float, int]:
    """(decode tok/s, threads reported) of one `ggufdesk run` under the limit."""
    cmd = [python, "-m", "ggufdesk", "run", model, "--prompt", PROMPT, "--json", "--max-tokens", str(tokens),
           "--temperature", "0", "--threads", str(threads), "--threads-batch", str(threads)]
    pre: Callable[[], None] | None = None
    if limit == "affinity":
        cmd = ["taskset", "-c", "0", *cmd]
    elif limit == "quota" and cgroup is not None:
        procs = cgroup / "cgroup.procs"

        def join() -> None:  # the child joins the cgroup before it execs: the engine it starts follows
            procs.write_text(str(os.getpid()))
        pre = join
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, preexec_fn=pre)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed: {out.stderr.strip()[-400:]}")
    stats = json.loads(out.stdout[out.stdout.index("{"):])
    return float(stats["decode_tok_s"]), int(stats.get("threads") or threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--model", default=None)
    ap.add_argument("--limits", default="none,affinity,quota", help="none: the whole machine, for reference")
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose ggufdesk runs")
    a = ap.parse_args()
    model = a.model or str(starter_model_path())
    limits = [x for x in a.limits.split(",") if x]
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        raise SystemExit("needs at least 2 CPUs: the limit is 1")
    runs: dict[tuple[str, str], list[tuple[float, int]]] = {}
    with quota_cgroup(1.0) as cg:
        if "quota" in limits and cg is None:
            print("quota: no writable cgroup here (needs root and the cpu controller): skipped")
            limits.remove("quota")
        for r in range(a.rounds):
            names = list(SETTINGS)[r % 3:] + list(SETTINGS)[:r % 3]
            for limit in limits[r % len(limits):] + limits[:r % len(limits)]:
                for name in names:
                    tok_s, th = one(a.python, model, SETTINGS[name], a.tokens, limit, cg)
                    runs.setdefault((limit, name), []).append((tok_s, th))
                    print(f"round {r + 1} {limit:8s} {name:8s} {tok_s:6.1f} tok/s  threads {th}", flush=True)
    print("\nlimit     " + "".join(f"{n:>16s}" for n in SETTINGS) + "   default / better fixed")
    for limit in limits:
        med = {n: statistics.median(t for t, _ in runs[(limit, n)]) for n in SETTINGS}
        best = max(med["fixed 1"], med["fixed 2"])
        cells = "".join(f"{med[n]:>10.1f} tok/s" for n in SETTINGS)
        print(f"{limit:8s}  {cells}   {med['default'] / best:.2f}")


if __name__ == "__main__":
    main()
