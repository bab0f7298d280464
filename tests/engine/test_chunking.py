"""The prefill chunk beside decoding streams is sized from measured step times (engine/batching/chunking.py)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ggufdesk.engine.batching.chunking import LOW_SHARE, MIN_CHUNK, ChunkSizer
from ggufdesk.engine.batching.sequence import SequenceStatus
from ggufdesk.engine.batching.scheduler import Scheduler


def fake_step(n_decode: int, n_prompt: int, position: int) -> float:
    """A step's cost: 10 ms of decode plus 0.5 ms per prompt token, growing with the position."""
    return 0.010 + n_prompt * 0.0005 * (1 + position / 1000)


def feed(s: ChunkSizer, n_decode: int, n: int, start: int, cost: Callable[[int, int, int], float]) -> float:
    """One chunk step of n tokens from `start`, told to the sizer as the engine tells it; its cost."""
    t = cost(n_decode, n, start)
    s.observe(n_decode, n, t, sum(range(start, start + n)))
    return t


def prefill(s: ChunkSizer, n_decode: int, total: int, cost: Callable[[int, int, int], float],
            start: int = 0) -> tuple[list[int], float]:
    """Read a prompt from `start` to `total` beside n_decode rows, chunk by chunk: the chunks and the
    worst step in plain steps."""
    done, sizes, worst = start, [], 0.0
    while done < total:
        c = min(s.chunk(n_decode, done), total - done)
        worst = max(worst, feed(s, n_decode, c, done, cost) / cost(n_decode, 0, 0))
        sizes.append(c)
        done += c
    return sizes, worst


def test_before_any_measurement_one_tile_of_rows_is_read():
    s = ChunkSizer(n_batch=512)
    assert s.chunk(4) == 28 and s.chunk(1) == 31  # the cheapest step worth measuring
    assert s.chunk(20) == 44  # at least half a tile of prompt tokens
    assert ChunkSizer(n_batch=24).chunk(4) == 20  # as many as the batch holds


def test_steps_stay_near_the_stall_budget_while_the_prompt_grows():
    s = ChunkSizer(n_batch=512, stall=9.0)
    for _ in range(5):
        s.observe(4, 0, fake_step(4, 0, 0))
    assert abs(s.decode_s[4] - 0.010) < 1e-9
    sizes, worst = prefill(s, 4, 3000, fake_step)
    assert worst <= 9.0 * 1.1  # the budget, give or take the first steps (before positions spread for a slope)
    assert prefill(s, 4, 6000, fake_step, start=3000)[1] <= 9.0 * 1.03  # then the position is priced
    assert sizes[1] > sizes[-2]  # later tokens cost more, so chunks shrink
    assert all((c + 4) % 32 == 0 for c in sizes[1:-1])  # rows fill whole tiles
    assert s.slope > 0


def deep_cost(n_decode: int, n_prompt: int, start: int) -> float:
    """SmolLM2-135M beside one row on the 2-core CPU, roughly: a token costs 3.4 ms plus 4 us per position
    it attends over (3.4 ms at 0, 15 at 3,000, 68 at 16,000)."""
    return 0.010 + sum(0.0034 + 0.000004 * p for p in range(start, start + n_prompt))


def test_a_prompt_resuming_deep_is_priced_at_its_depth():
    # an agent's next turn: 40 new tokens after 16,000 cached ones, right after a short chat prompt was read
    s = ChunkSizer(n_batch=512)
    s.observe(1, 0, 0.010)
    prefill(s, 1, 3000, deep_cost)  # a long prompt earlier: the slope is learned
    assert 0.000003 < s.slope < 0.000005
    prefill(s, 1, 300, deep_cost)  # a short chat prompt since: its tokens are cheap
    assert s.chunk(1, 300) >= 16  # the chat's price: 24 tokens fit the budget there
    # priced where it resumes, not where the last chunk was read: not one token fits 8 plain steps at 16,000
    # (67 ms each), so the fewest worth a step; sent whole as the chat's price says, 40 tokens cost 270 plain steps
    sizes, worst = prefill(s, 1, 16040, deep_cost, start=16000)
    assert sizes == [MIN_CHUNK] * 5 and worst < 56


def test_deeper_than_the_budget_allows_a_chunk_gives_way_down_to_a_few_tokens():
    s = ChunkSizer(n_batch=512)
    s.observe(4, 0, 0.010)
    s.observe(4, 28, 0.010 + 28 * 0.05)  # absurdly slow prompt tokens: not one fits 8 plain steps
    assert s.chunk(4) == MIN_CHUNK  # never fewer: below it a token's share climbs and the prompt crawls
    s = ChunkSizer(n_batch=512)
    s.observe(1, 0, 0.010)
    s.observe(1, 31, 0.010 + 31 * 0.008)  # 8 ms a token: 10 fit the budget of 80 ms
    assert s.chunk(1) == 10  # less than a tile: as many as fit, not rounded up to 31


def shaped_cost(n_decode: int, n_prompt: int, start: int) -> float:
    """A step whose prompt tokens cost 1.5x as much in a 64-row step as in a 32-row one (as the starter's
    60- and 28-token chunks beside 4 rows in the engine's loop near position 2,700: 7.0 and 4.7 ms a token)."""
    rows = n_decode + n_prompt
    return 0.025 + n_prompt * 0.003 * (1.5 if rows > 32 else 1.0)


def test_each_shape_of_step_keeps_its_own_price():
    # 8 plain steps are 200 ms: 60 tokens fit at a 32-row step's price (180 ms), not at their own (270)
    s = ChunkSizer(n_batch=512)
    s.observe(4, 0, 0.025)
    feed(s, 4, 28, 0, shaped_cost)
    sizes, worst = prefill(s, 4, 2000, shaped_cost, start=28)
    assert sizes[0] == 60 and worst <= 11.81  # one 60-token step (11.8x), priced as its nearest shape, then:
    assert s.shapes[2].token_s > 1.4 * s.shapes[1].token_s
    assert sizes[1:-1] == [28] * (len(sizes) - 2)  # one price for both swung between 28 and 60, the 60s at 11.8x


def test_the_slope_needs_spread_positions_and_is_never_negative():
    s = ChunkSizer(n_batch=512)
    s.observe(1, 0, 0.010)
    for _ in range(20):  # every chunk at the same place: no slope to see
        feed(s, 1, 31, 100, deep_cost)
    assert s.slope == 0.0
    t = ChunkSizer(n_batch=512)
    t.observe(1, 0, 0.010)
    for start in range(0, 4000, 31):  # tokens that get cheaper deeper (a clock that lies): no negative slope
        feed(t, 1, 31, start, lambda d, n, p: 0.010 + n * max(0.0001, 0.005 - 0.000001 * p))
    assert t.slope == 0.0


def test_nearer_the_start_than_measured_a_price_falls_to_half_at_most():
    s = ChunkSizer(n_batch=512)
    s.observe(1, 0, 0.010)
    prefill(s, 1, 6000, deep_cost)
    shape = s.shapes[1]
    assert shape.price(0, s.slope) == LOW_SHARE * shape.token_s  # 27 ms measured deep, 3.4 at 0: about 14
    assert shape.price(shape.at + 1000, s.slope) > shape.token_s


def test_faster_hardware_gets_bigger_chunks_and_the_batch_caps_them():
    fast = ChunkSizer(n_batch=256)
    fast.observe(2, 0, 0.010)
    fast.observe(2, 100, 0.010 + 100 * 0.00001)  # 10 us per prompt token: 8,000 would fit
    assert fast.chunk(2) == 254  # capped by n_batch minus the decode rows
    assert ChunkSizer(n_batch=4).chunk(4) == 0  # no room beside the decode rows
    free = ChunkSizer(n_batch=512)
    free.observe(4, 0, 0.010)
    free.observe(4, 124, 0.009)  # the chunk cost nothing measurable: take all the room there is
    assert free.shapes[4].token_s == 0.0 and free.chunk(4) == 508


def test_an_unmeasured_row_count_borrows_the_nearest_measured_one():
    s = ChunkSizer(n_batch=512)
    s.observe(4, 0, 0.020)
    s.observe(6, 60, 0.020 + 60 * 0.001)  # no plain 6-row step yet: judged against the 4-row one
    assert abs(s.shapes[3].token_s - 0.001) < 1e-9
    s.observe(0, 10, 1.0)  # no decode rows: nothing to learn for running streams
    s.observe(4, 0, -1.0)  # a clock that went backwards is ignored
    assert s.decode_s == {4: 0.020}
    assert s.cost(4, 28, 0) == 28 * 0.001  # an unmeasured shape is priced as the nearest measured one


@dataclass(eq=False)
class Req:
    reserve: int
    status: SequenceStatus = SequenceStatus.WAITING
    prompt_left: int = 1000
    watched: bool = True
    n_done: int = 0


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


def test_the_scheduler_prices_a_chunk_where_its_prompt_resumes():
    sched: Scheduler[Req] = Scheduler(n_slots=4, n_cells=100_000, n_batch=512, prefill_chunk=0)
    assert sched.sizer is not None
    talker, agent = Req(10), Req(10, n_done=16000, prompt_left=40)  # an agent's next turn, 16,000 tokens in
    for r in (talker, agent):
        sched.submit(r)
    sched.admit()
    talker.status = SequenceStatus.DECODING
    sched.sizer.observe(1, 0, 0.010)
    prefill(sched.sizer, 1, 3000, deep_cost)
    prefill(sched.sizer, 1, 300, deep_cost)  # cheap tokens lately
    assert sched.plan().prefills[0].n == MIN_CHUNK
    agent.n_done = 100
    assert sched.plan().prefills[0].n >= 16
