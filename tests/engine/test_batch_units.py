"""The batched engine's bookkeeping without llama.cpp: KV slots, shared prefix cells, admission, step plans."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from ggufdesk.engine.batching.prefix_cache import Slots
from ggufdesk.engine.batching.sequence import SequenceStatus
from ggufdesk.engine.batching.scheduler import Overloaded, Scheduler


class FakeMemory:
    """Records the llama.cpp memory calls the slots make."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        self.calls.append(("rm", seq, p0, p1))
        return True

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))


def test_finished_requests_keep_their_prefix_and_the_next_turn_continues_in_place():
    mem = FakeMemory()
    slots = Slots(1, 100, mem)
    s, reused = slots.acquire([1, 2, 3, 4])
    assert reused == 0 and s.busy
    slots.extend(s, [1, 2, 3, 4, 9])
    slots.release(s)
    assert slots.used == 5  # resident after the request ended
    s2, reused = slots.acquire([1, 2, 3, 4, 9, 7, 8])
    assert s2 is s and reused == 5 and slots.used == 5
    slots.release(s2)
    # a different prompt in the only slot: truncated to the common prefix, last prompt token re-evaluated
    s3, reused = slots.acquire([1, 2, 5])
    assert reused == 2 and slots.used == 2 and ("rm", 0, 2, -1) in mem.calls


def test_a_shared_prefix_is_copied_not_recomputed_and_costs_no_cells():
    mem = FakeMemory()
    slots = Slots(3, 100, mem)
    a, _ = slots.acquire([1, 2, 3, 4, 5])
    slots.extend(a, [1, 2, 3, 4, 5])  # a is still running
    b, reused = slots.acquire([1, 2, 3, 4, 6, 7])
    assert b is not a and reused == 4 and ("cp", a.seq, b.seq, 0, 4) in mem.calls
    assert slots.used == 5  # the 4 shared cells are counted once
    slots.extend(b, [6, 7])
    assert slots.used == 7
    slots.release(a, keep=False)
    assert slots.used == 6  # a's private cell freed; the shared ones live on in b


def test_an_idle_source_with_a_longer_continuation_is_copied_not_cut():
    slots = Slots(2, 100, FakeMemory())
    a, _ = slots.acquire([1, 2, 3])
    slots.extend(a, [1, 2, 3, 10, 11])
    slots.release(a)
    b, reused = slots.acquire([1, 2, 3, 20])
    assert b is not a and reused == 3 and a.tokens == [1, 2, 3, 10, 11]


def test_eviction_is_least_recently_used_and_never_touches_busy_slots():
    slots = Slots(3, 10, FakeMemory())
    a, _ = slots.acquire([1])
    slots.extend(a, [1, 1, 1])
    b, _ = slots.acquire([2])
    slots.extend(b, [2, 2, 2])
    c, _ = slots.acquire([3])
    slots.extend(c, [3, 3, 3])
    slots.release(a)
    slots.release(b)
    assert slots.free == 1
    assert slots.evict(3) and a.tokens == [] and b.tokens == [2, 2, 2]
    assert not slots.evict(8) and c.tokens == [3, 3, 3]  # only idle slots are evicted


@dataclass(eq=False)
class Req:
    reserve: int
    status: SequenceStatus = SequenceStatus.WAITING
    prompt_left: int = 1000
    watched: bool = True
    n_done: int = 0


def test_admission_waits_for_cells_in_fifo_order_and_refuses_when_the_queue_is_full():
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=100, n_batch=64, prefill_chunk=16, max_queue=2)
    big, small, tiny = Req(60), Req(50), Req(10)
    sched.submit(big)
    assert sched.admit() == [big]
    sched.submit(small)
    sched.submit(tiny)
    with pytest.raises(Overloaded, match="busy"):
        sched.submit(Req(1))
    assert sched.admit() == []  # small does not fit beside big; tiny must not jump the queue
    sched.remove(big)
    assert sched.admit() == [small, tiny]


def test_a_request_alone_is_admitted_even_if_it_fills_the_context():
    sched: Scheduler[Req] = Scheduler(n_slots=2, n_cells=100, n_batch=64, prefill_chunk=16)
    sched.submit(Req(100))
    assert len(sched.admit()) == 1


def test_plan_decodes_everyone_and_prefills_one_chunk_under_the_budget():
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=1000, n_batch=64, prefill_chunk=16)
    p1, p2 = Req(10), Req(10)
    sched.submit(p1)
    sched.submit(p2)
    sched.admit()
    plan = sched.plan()
    assert p1.status is p2.status is SequenceStatus.PREFILLING  # admission starts their prefill
    assert plan.decode == [] and plan.prefill is p1 and plan.chunk == 64  # nobody waits: whole batch
    p1.status = SequenceStatus.DECODING
    plan = sched.plan()
    assert [r.seq for r in plan.decode] == [p1] and plan.prefill is p2 and plan.chunk == 16  # p1 decodes: small chunk
    p2.status = SequenceStatus.VERIFYING  # (last step it carried drafts: it runs all the same)
    plan = sched.plan()
    assert [r.seq for r in plan.decode] == [p1, p2] and plan.prefill is None
    assert plan.decode_rows == 2 and plan.sequences() == [p1, p2] and not plan.empty


def test_prompts_that_end_within_the_budget_leave_the_rest_to_the_next_in_admission_order():
    # four short prompts sent at once are read in one step (llama-server's way), not one a step
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=1000, n_batch=64, prefill_chunk=16)
    reqs = [Req(40, prompt_left=n) for n in (20, 30, 25, 5)]
    for r in reqs:
        sched.submit(r)
    sched.admit()
    plan = sched.plan()
    assert [(p.seq, p.n, p.completes) for p in plan.prefills] == [(reqs[0], 20, True), (reqs[1], 30, True),
                                                                    (reqs[2], 14, False)]
    assert plan.chunk == 64 and plan.prefill is reqs[0] and plan.sequences() == reqs[:3]
    for r, p in zip(reqs, plan.prefills):
        r.prompt_left -= p.n
    reqs[0].status = reqs[1].status = SequenceStatus.DECODING
    plan = sched.plan()  # two decode: the fixed chunk of 16 for the prompts, the unfinished one first
    assert [(p.seq, p.n) for p in plan.prefills] == [(reqs[2], 11), (reqs[3], 5)] and plan.chunk == 16


def test_the_batch_size_bounds_the_chunk():
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=1000, n_batch=4, prefill_chunk=16)
    reqs = [Req(10) for _ in range(4)]
    for r in reqs:
        sched.submit(r)
    sched.admit()
    for r in reqs[:3]:
        r.status = SequenceStatus.DECODING
    plan = sched.plan()
    assert len(plan.decode) == 3 and plan.chunk == 1


def test_cache_prompt_false_reuses_no_cached_prefix():
    """llama-server's `cache_prompt: false`: the prompt is read whole, the cached prefix stays for others."""
    mem = FakeMemory()
    slots = Slots(2, 100, mem)
    a, _ = slots.acquire([1, 2, 3, 4])
    slots.extend(a, [1, 2, 3, 4])
    slots.release(a)
    b, reused = slots.acquire([1, 2, 3, 4, 5], reuse=False)
    assert reused == 0 and b is not a and not any(c[0] == "cp" for c in mem.calls)
    slots.release(b)
    c, reused = slots.acquire([1, 2, 3, 4, 5])
    assert reused == 4  # a's prefix was kept for the next request that may reuse it
