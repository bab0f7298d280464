"""Issue 29's bound on the step loop: no function of engine/batching/ (schedule -> run -> update) nor the
worker's request loop above radon complexity 15. `make test`'s xenon holds the whole tree to 20 only."""
from __future__ import annotations

from pathlib import Path

from radon.visitors import ComplexityVisitor

import ggufdesk

ENGINE = Path(ggufdesk.__file__).parent / "engine"
LIMIT = 15


def blocks(path: Path) -> list[tuple[str, int]]:
    v = ComplexityVisitor.from_code(path.read_text(encoding="utf-8"))
    return ([(f.name, f.complexity) for f in v.functions]
            + [(f"{c.name}.{m.name}", m.complexity) for c in v.classes for m in c.methods])


def test_no_function_of_the_step_loop_is_above_15():
    loop = {p.name: blocks(p) for p in sorted((ENGINE / "batching").glob("*.py"))}
    assert len(loop) > 5  # the folder is where this test thinks it is
    worker = dict(blocks(ENGINE / "runtime" / "worker.py"))
    over = [(f, n, c) for f, bs in loop.items() for n, c in bs if c > LIMIT]
    over += [("worker.py", n, worker[n]) for n in ("Engine.next_request", "Engine._work_once") if worker[n] > LIMIT]
    assert not over, over
