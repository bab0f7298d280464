"""Token buckets and the admission queue on their own (no HTTP, no engine)."""
from __future__ import annotations

import asyncio

import pytest

from ggufdesk.server.admission import Admission
from ggufdesk.server.errors import ApiError
from ggufdesk.server.ratelimit import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_bucket_lets_a_caller_spend_its_minute_then_says_when_to_come_back():
    clock = Clock()
    rl = RateLimiter(60, clock=clock)  # one token per second
    assert rl.retry_after("a") is None
    rl.charge("a", 90)  # a request may overshoot; the caller is then in debt
    assert rl.retry_after("a") == 31  # back above zero after 30 s
    assert rl.retry_after("b") is None  # other callers have their own bucket
    clock.t += 31
    assert rl.retry_after("a") is None


def test_bucket_refills_only_up_to_its_capacity():
    clock = Clock()
    rl = RateLimiter(60, clock=clock)
    clock.t += 3600
    rl.charge("a", 60)
    assert rl.retry_after("a") == 1


def test_rate_limit_zero_is_off_and_negative_is_refused():
    rl = RateLimiter(0)
    rl.charge("a", 10**9)
    assert rl.retry_after("a") is None
    with pytest.raises(ValueError):
        RateLimiter(-1)


def test_admission_runs_in_order_and_refuses_beyond_the_queue():
    async def main() -> None:
        adm = Admission(slots=1, max_queue=2, memory_check=lambda: None)
        await adm.acquire()
        order: list[int] = []

        async def wait(i: int) -> None:
            await adm.acquire()
            order.append(i)

        waiters = [asyncio.create_task(wait(i)) for i in range(2)]
        await asyncio.sleep(0)
        assert (adm.running, adm.queued) == (1, 2)
        with pytest.raises(ApiError) as e:
            await adm.acquire()
        assert e.value.status == 503 and e.value.retry_after >= 1
        adm.release()
        adm.release()
        await asyncio.gather(*waiters)
        assert order == [0, 1]
        adm.release()
        assert (adm.running, adm.queued) == (0, 0)

    asyncio.run(main())


def test_a_waiter_that_gives_up_leaves_the_queue():
    async def main() -> None:
        adm = Admission(slots=1, max_queue=4, memory_check=lambda: None)
        await adm.acquire()
        task = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        assert adm.queued == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert adm.queued == 0
        adm.release()
        assert adm.running == 0

    asyncio.run(main())


def test_low_memory_refuses_new_work_with_503():
    async def main() -> None:
        adm = Admission(slots=4, max_queue=4, memory_check=lambda: "the server is low on memory")
        with pytest.raises(ApiError) as e:
            await adm.acquire()
        assert e.value.status == 503 and e.value.code == "low_memory"
        assert adm.running == 0

    asyncio.run(main())


def test_memory_under_the_planners_margin_is_a_reason_to_refuse(monkeypatch):
    from types import SimpleNamespace

    from ggufdesk.server import admission

    monkeypatch.setattr(admission.psutil, "virtual_memory",
                        lambda: SimpleNamespace(total=16 * 2**30, available=int(0.5 * 2**30)))
    assert "low on memory (0.5 GiB free, keeping 1.6 GiB in reserve)" in admission.low_memory()
    monkeypatch.setattr(admission.psutil, "virtual_memory",
                        lambda: SimpleNamespace(total=16 * 2**30, available=8 * 2**30))
    assert admission.low_memory() is None


def test_reasoning_fields_of_the_apis():
    from ggufdesk.server import reasoning as R
    from ggufdesk.server.errors import ApiError

    assert R.openai_fields() == {}
    assert R.openai_fields(effort="none") == {"think": False}
    assert R.openai_fields(effort="high", budget=64) == {"think": "high", "reasoning_budget": 64}
    assert R.openai_fields(template_kwargs={"enable_thinking": False}) == {"think": False}
    assert R.openai_fields(think=True, budget=-1) == {"think": True, "reasoning_budget": -1}
    assert R.anthropic_fields({"type": "enabled", "budget_tokens": 1024}) == {"think": True, "reasoning_budget": 1024}
    assert R.anthropic_fields({"type": "disabled"}) == {"think": False}
    assert R.anthropic_fields({"type": "adaptive"}) == R.anthropic_fields(None) == {}
    for bad in (dict(effort="extreme"), dict(budget=-7), dict(budget=True), dict(think="maybe")):
        with pytest.raises(ApiError):
            R.openai_fields(**bad)
    with pytest.raises(ApiError):
        R.anthropic_fields({"type": "sometimes"})
