"""The batched engine on tiny models: concurrent streams, parity with running alone, admission, prefix cache."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.engine.helpers import Result, collect, greedy
from tests.fixtures import ggufs

PARALLEL = LoadSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=4,
                        prefill_chunk=16)
PROMPTS = [
    "hello the cat and the dog were in the house",
    "the red tree was by the water and",
    "one two three of the people " * 6,  # long enough to be prefilled in several chunks beside the others
    "a man came back from the world",
]

# Prompts whose greedy answers (60 tokens) have no near tie: the top two tokens at least 0.09 nats apart at
# every step, with f32 and f16 weights. llama.cpp is not batch-invariant: where a prompt's rows are read
# beside others, in other chunks, or come back from a prompt cache, its logprobs move by up to ~0.03 nats
# on this tiny model (PROMPTS' second and third have ties of 0.005 and 0.015-0.021, which shapes tip).
CLEAR_PROMPTS = [
    "one two three of the people " * 5,
    "one two three of the people " * 7,
    "red blue green light dark " * 7,
    "the cat and the dog " * 8,
]


def collect_all(client, rids: list[str]) -> list[Result]:
    """Read several streams at once, one thread each (as a server would)."""
    out: dict[str, Result] = {}

    def read(rid: str) -> None:
        out[rid] = collect(client, rid)

    threads = [threading.Thread(target=read, args=(rid,)) for rid in rids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[rid] for rid in rids]


def submit_together(client, prompts: list[str], **kw) -> list[str]:
    """Send requests while the engine is stopped (SIGSTOP), so they all wait in its inbox and the
    first step already sees them all (instead of depending on how fast the lines arrive)."""
    os.kill(client.pid, signal.SIGSTOP)
    try:
        return [client.generate(prompt=p, **kw) for p in prompts]
    finally:
        os.kill(client.pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def batched(tiny_model):
    with EngineClient() as c:
        c.load(str(tiny_model), settings=PARALLEL)
        yield c


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_greedy_output_is_identical_alone_and_beside_three_others(dtype, model_dir):
    model = ggufs.write_tiny_llama(model_dir / f"parity-{dtype}.gguf", ggufs.TinySpec(seed=0, dtype=dtype))
    with EngineClient() as c:
        c.load(str(model), settings=PARALLEL)
        together = collect_all(c, submit_together(c, CLEAR_PROMPTS, sampling=greedy(60)))
        statuses = [e for e in c.events(timeout=0.05) if isinstance(e, P.Status)]
        alone = [collect(c, c.generate(prompt=p, sampling=greedy(60))) for p in CLEAR_PROMPTS]
    for a, b in zip(alone, together):
        assert a.error is None and b.error is None
        assert b.done.tokens == a.done.tokens and b.text == a.text
    # they really shared steps (llama.cpp's per-context timings are then nobody's own)
    assert all(r.stats.llama_perf == {} for r in together) and all(r.stats.llama_perf for r in alone)
    # the engine says how busy it is, and that it is idle again at the end
    assert statuses and statuses[-1].running == 0 and statuses[-1].queued == 0
    assert all(s.n_parallel == 4 and s.kv_cells_total == 1024 for s in statuses)
    # its decode calls (for /metrics' llamacpp:n_decode_total): counted, and shared by several sequences
    last = statuses[-1]
    assert 0 < last.n_decode < last.n_busy <= 4 * last.n_decode
    assert [s.n_decode for s in statuses] == sorted(s.n_decode for s in statuses)


def test_concurrent_streams_each_get_their_own_tokens_and_stats(batched):
    rs = collect_all(batched, submit_together(batched, PROMPTS, sampling=greedy(20)))
    for r in rs:
        assert r.error is None and r.done.finish_reason == "length" and r.stats.final
        assert r.stats.n_gen == 20 and r.done.usage["completion_tokens"] == 20
        assert r.stats.ttft_s > 0 and r.stats.decode_tok_s > 0
    assert len({tuple(r.done.tokens) for r in rs}) > 1  # different prompts, different answers


def test_a_shared_prefix_is_prefilled_once(batched):
    system = "the cat and the dog were in the house " * 8
    shared = collect(batched, batched.generate(prompt=system, sampling=greedy(1))).stats.n_prompt
    first = collect(batched, batched.generate(prompt="water " + system + "hello", sampling=greedy(4)))
    second = collect(batched, batched.generate(prompt="water " + system + "fire", sampling=greedy(4)))
    assert first.stats.n_reused <= 2 and second.stats.n_reused >= shared - 2
    # while one request holds the prefix in a running sequence, another copies it from there
    a = batched.generate(prompt=system + "red blue green " * 10, sampling=greedy(40))
    b = batched.generate(prompt=system + "light dark", sampling=greedy(4))
    ra, rb = collect_all(batched, [a, b])
    assert ra.error is None and rb.stats.n_reused >= shared - 2
    # and what it computes on the copied prefix is what it computes from scratch
    collect(batched, batched.generate(prompt="dark " * 30, sampling=greedy(1)))
    cold = collect(batched, batched.generate(prompt=system + "light dark", sampling=greedy(4)))
    assert cold.text == rb.text


def test_cancel_one_stream_leaves_the_others_untouched(batched):
    ref = [collect(batched, batched.generate(prompt=p, sampling=greedy(40))) for p in PROMPTS[:2]]
    victim = batched.generate(prompt=PROMPTS[2], sampling=greedy(900))
    others = [batched.generate(prompt=p, sampling=greedy(40)) for p in PROMPTS[:2]]
    seen = 0
    for ev in batched.stream(victim):
        if isinstance(ev, P.Token):
            seen += 1
            if seen == 3:
                batched.cancel(victim)
        if isinstance(ev, P.Done):
            assert ev.finish_reason == "cancelled"
    rs = collect_all(batched, others)
    assert [r.done.tokens for r in rs] == [r.done.tokens for r in ref]


def test_logprobs_come_with_each_token(batched):
    r = Result()
    lps = []
    rid = batched.generate(prompt=PROMPTS[0], sampling=greedy(12), logprobs=3)
    for ev in batched.stream(rid):
        if isinstance(ev, P.Token):
            r.text += ev.text
            lps += ev.logprobs or []
        elif isinstance(ev, P.Done):
            r.done = ev
    assert len(lps) == len(r.done.tokens)
    for e in lps:
        assert len(e["top"]) == 3 and e["logprob"] <= 0
        assert e["top"][0]["token"] == e["token"]  # greedy picks the most likely token
        assert e["top"][0]["logprob"] == pytest.approx(e["logprob"])
        assert [t["logprob"] for t in e["top"]] == sorted((t["logprob"] for t in e["top"]), reverse=True)
    plain = collect(batched, batched.generate(prompt=PROMPTS[0], sampling=greedy(12)))
    assert plain.text == r.text


@pytest.mark.parametrize("logprobs", [-1, 101, "3", True])
def test_bad_logprobs_are_refused(batched, logprobs):
    r = collect(batched, batched.generate(prompt="x", sampling=greedy(2), logprobs=logprobs))
    assert r.error is not None and "logprobs" in r.error.message


def test_a_prompt_that_can_never_fit_is_a_context_error(batched):
    r = collect(batched, batched.generate(prompt="cat " * 1100, sampling=greedy(2, context_overflow="error")))
    assert r.error is not None and r.error.kind == "context"


def test_a_burst_beyond_the_queue_is_refused_cleanly_and_nothing_is_lost(tiny_model):
    """All requests are in the engine's inbox before its first step (submit_together)."""
    settings = LoadSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=2)
    with EngineClient() as c:
        c.load(str(tiny_model), settings=settings)
        rs = collect_all(c, submit_together(c, [f"hello {i} the cat" for i in range(60)], sampling=greedy(100)))
        done = [r for r in rs if r.done is not None]
        refused = [r for r in rs if r.error is not None]
        assert len(done) + len(refused) == 60
        assert all(r.error.kind == "overloaded" and "busy" in r.error.message for r in refused)
        assert refused and len(done) >= 2 + 16  # the running ones and a full queue were served
        assert all(r.done.finish_reason in ("length", "stop") and r.done.tokens for r in done)
        assert collect(c, c.generate(prompt="hello", sampling=greedy(3))).error is None


def test_requests_wait_for_cells_and_then_run(tiny_model):
    """Two requests that cannot both fit the context run one after the other, both in full."""
    settings = LoadSettings(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=2)
    with EngineClient() as c:
        c.load(str(tiny_model), settings=settings)
        rs = collect_all(c, submit_together(c, PROMPTS[:2], sampling=greedy(150)))
        statuses = [e for e in c.events(timeout=0.05) if isinstance(e, P.Status)]
    assert all(r.error is None and r.done.finish_reason in ("length", "stop") for r in rs)
    # never both at once (2 x (prompt + 150) > 256 cells): each had llama.cpp's timings to itself
    assert all(r.stats.llama_perf for r in rs)
    assert all(s.kv_cells_used <= 256 and s.running <= 1 for s in statuses)


def test_speculation_runs_beside_others_in_the_same_steps(tiny_model):
    """Every stream drafts in the batched steps (no pause while several run), and each is lossless."""
    with EngineClient() as c:
        # fixed K: adaptive lookup rightly drafts nothing on the tiny model's short chance matches
        c.load(str(tiny_model), settings=PARALLEL, speculation={"mode": "lookup", "adaptive": False,
                                                                "lookup_history": False})
        alone = [collect(c, c.generate(prompt=p, sampling=greedy(60))) for p in CLEAR_PROMPTS]
        rs = collect_all(c, submit_together(c, CLEAR_PROMPTS, sampling=greedy(60)))
    assert all(r.stats.speculation == "lookup" and r.stats.drafted > 0 for r in rs)
    assert [r.done.tokens for r in rs] == [a.done.tokens for a in alone]  # lossless either way
    assert all(r.stats.llama_perf == {} for r in rs)  # they did share steps
