"""The prefill chunk beside decoding streams is sized from measured step times (engine/batching/chunking.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ggufdesk.engine.batching.chunking import FALLBACK, ChunkSizer
from ggufdesk.engine.batching.sequence import SequenceStatus
from ggufdesk.engine.batching.scheduler import Scheduler


def fake_step(n_decode: int, n_prompt: int, position: int) -> float:
    """A step's cost: 10 ms of decode plus 0.5 ms per prompt token, growing with the position."""
    return 0.010 + n_prompt * 0.0005 * (1 + position / 1000)


def test_before_any_measurement_the_fallback_fills_whole_tiles():
    s = ChunkSizer(n_batch=512)
    assert s.chunk(4) + 4 == 128 and abs(s.chunk(4) - FALLBACK) < 32


def test_steps_stay_near_the_stall_budget_while_the_prompt_grows():
    s = ChunkSizer(n_batch=512, stall=9.0)
    for _ in range(5):
        s.observe(4, 0, fake_step(4, 0, 0))
    assert abs(s.decode_s[4] - 0.010) < 1e-9
    done, sizes, worst = 0, [], 0.0
    while done < 3000:
        c = s.chunk(4)
        t = fake_step(4, c, done)
        s.observe(4, c, t)
        worst = max(worst, t / 0.010)
        sizes.append(c)
        done += c
    assert worst <= 9.0 * 1.15  # the budget, give or take the lag of one step
    assert sizes[1] > sizes[-1]  # later tokens cost more, so chunks shrink
    assert all((c + 4) % 32 == 0 for c in sizes[1:])  # rows fill whole tiles


def test_faster_hardware_gets_bigger_chunks_and_the_batch_caps_them():
    fast = ChunkSizer(n_batch=256)
    fast.observe(2, 0, 0.010)
    fast.observe(2, 100, 0.010 + 100 * 0.00001)  # 10 us per prompt token: 8,000 would fit
    assert fast.chunk(2) == 254  # capped by n_batch minus the decode rows
    assert ChunkSizer(n_batch=4).chunk(4) == 0  # no room beside the decode rows
    free = ChunkSizer(n_batch=512)
    free.observe(4, 0, 0.010)
    free.observe(4, 124, 0.009)  # the chunk cost nothing measurable: take all the room there is
    assert free.token_s == 0.0 and free.chunk(4) == 508


def test_a_chunk_is_never_tiny_even_when_prompt_tokens_are_expensive():
    s = ChunkSizer(n_batch=512)
    s.observe(4, 0, 0.010)
    s.observe(4, 28, 0.010 + 28 * 0.05)  # absurdly slow prompt tokens
    assert s.chunk(4) >= 16


def test_an_unmeasured_row_count_borrows_the_nearest_measured_one():
    s = ChunkSizer(n_batch=512)
    s.observe(4, 0, 0.020)
    s.observe(6, 60, 0.020 + 60 * 0.001)  # no plain 6-row step yet: judged against the 4-row one
    assert s.token_s is not None and abs(s.token_s - 0.001) < 1e-9
    s.observe(0, 10, 1.0)  # no decode rows: nothing to learn for running streams
    s.observe(4, 0, -1.0)  # a clock that went backwards is ignored
    assert s.decode_s == {4: 0.020}


@dataclass(eq=False)
class Req:
    reserve: int
    status: SequenceStatus = SequenceStatus.WAITING
    prompt_left: int = 1000
    watched: bool = True


def test_the_scheduler_asks_the_sizer_only_when_someone_decodes():
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=1000, n_batch=512, prefill_chunk=0)
    assert sched.sizer is not None
    a, b = Req(10), Req(10)
    sched.submit(b)
    sched.admit()
    assert sched.plan().chunk == 512  # alone: the whole batch
    sched.submit(a)
    sched.admit()
    a.status = SequenceStatus.DECODING
    sched.sizer.observe(1, 0, 0.010)
    sched.sizer.observe(1, 63, 0.010 + 63 * 0.001)
    # 8 plain steps of prompt work fit 80 tokens; 1 + 80 rows round down to 64: 63 tokens
    assert sched.plan().chunk == 63
    assert Scheduler(n_slots=4, n_cells=1000, n_batch=512, prefill_chunk=16).sizer is None


def test_beside_answers_nobody_streams_a_prompt_is_read_a_whole_batch_at_a_time():
    # a non-streaming request's answer goes out whole at its end: fewer, larger steps finish sooner
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=1000, n_batch=512, prefill_chunk=0)
    assert sched.sizer is not None
    quiet, streamed, late = Req(10, watched=False), Req(10), Req(10)
    for r in (quiet, streamed, late):
        sched.submit(r)
    sched.admit()
    quiet.status = SequenceStatus.DECODING
    sched.sizer.observe(1, 0, 0.010)
    sched.sizer.observe(1, 63, 0.010 + 63 * 0.001)
    plan = sched.plan()  # only the unwatched one decodes: the two prompts share the whole batch
    assert [(p.seq, p.n) for p in plan.prefills] == [(streamed, 511)] and plan.chunk == 511
    streamed.status = SequenceStatus.DECODING  # a stream decodes now: the sizer's chunk again
    sched.sizer.observe(2, 0, 0.010)
    sched.sizer.observe(2, 62, 0.010 + 62 * 0.001)
    assert sched.plan().prefills[0].seq is late and sched.plan().chunk == 62
