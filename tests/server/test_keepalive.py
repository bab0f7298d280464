"""Streams that go quiet (a long prompt being read) send keep-alives, so clients with idle timeouts stay."""
from __future__ import annotations

import asyncio

from ggufdesk.server.http import COMMENT, keepalive


def test_a_silent_stream_sends_beats_then_its_items_and_closes_its_body():
    closed = []

    async def body():
        try:
            yield "a"
            await asyncio.sleep(0.35)
            yield "b"
        finally:
            closed.append(True)

    async def run() -> list[str]:
        return [x async for x in keepalive(body(), lambda: COMMENT, 0.1)]

    out = asyncio.run(run())
    assert out[0] == "a" and out[-1] == "b" and out.count(COMMENT) >= 2 and closed == [True]


def test_no_beat_while_the_beat_says_not_yet_and_a_dropped_stream_stops_its_body():
    stopped = []

    async def body():
        try:
            await asyncio.sleep(10)
            yield "never"
        finally:
            stopped.append(True)

    async def run() -> list[str]:
        got = []
        gen = keepalive(body(), lambda: None, 0.05)
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.2)
        task.cancel()  # the client went away
        try:
            await task
        except asyncio.CancelledError:
            pass
        await gen.aclose()
        return got

    assert asyncio.run(run()) == [] and stopped == [True]
