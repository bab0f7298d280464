"""A request past its deadline is ended by the engine with a clear error, between two steps, and the request
queued behind it is served (issue 34, finding 3). The engine runs in this process on a fake clock."""
from __future__ import annotations

from ggufdesk.core.settings import LoadSettings, SamplingSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.worker import CancelBook, Engine
from tests.engine.helpers import greedy


def on_a_fake_clock(model, now: list[float]) -> tuple[Engine, list]:
    """An engine in this process, one request at a time, whose deadlines read now[0]."""
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(model), settings=LoadSettings(n_ctx=512, n_parallel=1)))
    engine.batch.clock = lambda: now[0]
    return engine, events


def test_a_request_past_its_deadline_ends_with_a_timeout_and_the_next_is_served(tiny_model):
    now = [1000.0]
    engine, events = on_a_fake_clock(tiny_model, now)
    engine.generate(P.Generate(id="slow", prompt="the cat", sampling=SamplingSettings(**greedy(400)), deadline_s=30))
    engine.generate(P.Generate(id="next", prompt="the dog", sampling=SamplingSettings(**greedy(3)), deadline_s=30))
    for _ in range(3):
        engine.batch.step()
    assert not any(getattr(e, "id", None) == "slow" and isinstance(e, (P.Done, P.Error)) for e in events)
    now[0] += 31  # the clock jumps: the first request is past its deadline, the second one too but still queued
    engine.batch.step()
    err = next(e for e in events if isinstance(e, P.Error) and e.id == "slow")
    assert err.kind == "timeout" and "30 s" in err.message and "--request-timeout" in err.message
    ended = [e for e in events if isinstance(e, (P.Done, P.Error)) and e.id == "next"]
    assert ended and isinstance(ended[0], P.Error) and ended[0].kind == "timeout"  # (it waited past its own)
    engine.generate(P.Generate(id="after", prompt="the dog", sampling=SamplingSettings(**greedy(3)), deadline_s=30))
    while engine.batch.busy:
        engine.batch.step()
    done = next(e for e in events if isinstance(e, (P.Done, P.Error)) and e.id == "after")
    assert isinstance(done, P.Done) and engine.batch.slots.used >= 0
    engine.unload(quiet=True)


def test_a_queued_request_is_served_once_the_stuck_one_times_out(tiny_model):
    now = [0.0]
    engine, events = on_a_fake_clock(tiny_model, now)
    engine.generate(P.Generate(id="stuck", prompt="the cat", sampling=SamplingSettings(**greedy(400)), deadline_s=5))
    engine.generate(P.Generate(id="normal", prompt="the dog", sampling=SamplingSettings(**greedy(3)), deadline_s=100))
    engine.batch.step()
    now[0] = 6.0
    while engine.batch.busy:
        engine.batch.step()
    by_id = {e.id: e for e in events if isinstance(e, (P.Done, P.Error))}
    assert by_id["stuck"].kind == "timeout"
    assert isinstance(by_id["normal"], P.Done)
    engine.unload(quiet=True)


def test_a_nonsense_deadline_is_refused(tiny_model):
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model), settings=LoadSettings(n_ctx=256)))
    for bad in (0, -1, float("nan"), "5", True):
        engine.generate(P.Generate(id="r", prompt="hi", sampling=SamplingSettings(**greedy(2)), deadline_s=bad))  # type: ignore[arg-type]
        assert isinstance(events[-1], P.Error) and "deadline_s" in events[-1].message
    engine.unload(quiet=True)


def test_reading_a_long_prompt_does_not_count_against_the_deadline(tiny_model):
    """A prompt read in many chunks (a 20k-token agent prompt takes minutes on a small CPU) keeps its
    deadline for the answer: the clock jumps past it at every prefill step, and the request still
    answers; once it generates, the deadline holds again."""
    now = [0.0]
    events: list = []
    engine = Engine(events.append, CancelBook())  # type: ignore[arg-type]
    engine.load(P.Load(id="l", model=str(tiny_model),
                       settings=LoadSettings(n_ctx=512, n_parallel=1, n_batch=16, n_ubatch=16)))
    engine.batch.clock = lambda: now[0]
    prompt = "the cat sat on the mat and the dog ran in the park " * 8
    engine.generate(P.Generate(id="long", prompt=prompt, sampling=SamplingSettings(**greedy(400)), deadline_s=30))
    steps = 0
    while steps < 200 and not any(isinstance(e, (P.Token, P.Error)) and e.id == "long" for e in events):
        engine.batch.step()
        now[0] += 31  # every prefill step takes longer than the whole deadline
        steps += 1
    assert not any(isinstance(e, P.Error) for e in events)
    assert steps > 3, "the prompt must take several steps to read for this test to mean anything"
    now[0] += 31  # generating now: past the deadline
    engine.batch.step()
    err = next(e for e in events if isinstance(e, P.Error) and e.id == "long")
    assert err.kind == "timeout"
    engine.unload(quiet=True)
