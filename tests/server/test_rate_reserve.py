"""The token rate limit is reserved when a request is admitted and settled when it ends (issue 34, finding 6)."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from ggufdesk.server.ratelimit import RateLimiter
from tests.server.hostile_live import HANG_S, MODEL, record
from tests.server.serving import ServeProcess
from tests.server.test_units import Clock


def test_a_reservation_counts_at_once_and_is_refunded_at_the_end():
    clock = Clock()
    rl = RateLimiter(120, clock=clock)  # two tokens per second
    assert rl.reserve("a", 50) is None and rl.reserve("a", 50) is None
    assert rl.reserve("a", 50) == 15  # 20 left: 30 more needed, at 2 per second
    assert rl.reserve("b", 50) is None  # another caller has its own bucket
    rl.settle("a", 50, 10)  # the first request used 10 of its 50: 40 back
    assert rl.reserve("a", 50) is None


def test_using_more_than_reserved_is_taken_too():
    clock = Clock()
    rl = RateLimiter(60, clock=clock)
    assert rl.reserve("a", 10) is None
    rl.settle("a", 10, 70)  # the estimate was low: the caller is in debt
    assert rl.reserve("a", 1) == 11
    clock.t += 11
    assert rl.reserve("a", 1) is None


def test_a_request_larger_than_the_bucket_runs_on_a_full_one_only():
    clock = Clock()
    rl = RateLimiter(60, clock=clock)
    assert rl.reserve("a", 1000) is None  # full: it may start, and puts the caller 940 in debt
    assert rl.reserve("a", 1000) == 1000  # back to full after 1000 s
    rl.settle("a", 1000, 0)
    assert rl.reserve("a", 1000) is None


def test_no_limit_reserves_nothing():
    rl = RateLimiter(0)
    assert rl.reserve("a", 10**9) is None
    rl.settle("a", 10**9, 0)


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    server = ServeProcess(tiny_model, "--ctx", "512", "--parallel", "4", "--temperature", "0", "--rate-limit", "100",
                          home=tmp_path_factory.mktemp("rate-home"))
    yield server
    server.stop()


def test_60_concurrent_requests_cannot_pass_a_100_token_limit(limited):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=limited.url, timeout=HANG_S * 4) as c:
            return list(await asyncio.gather(*(c.post("/v1/chat/completions", json=body) for _ in range(60))))

    answers = asyncio.run(burst())
    ok = [r for r in answers if r.status_code == 200]
    limited_ = [r for r in answers if r.status_code == 429]
    used = sum(r.json()["usage"]["total_tokens"] for r in ok)
    record("60 concurrent requests, --rate-limit 100", served=len(ok), refused_429=len(limited_), tokens_used=used,
           retry_after=sorted({int(r.headers["retry-after"]) for r in limited_}))
    assert len(ok) + len(limited_) == 60
    assert 1 <= len(ok) <= 4  # each reserves ~24 tokens of the 100
    assert all(int(r.headers["retry-after"]) <= 60 for r in limited_)
