"""Images in the live step loop (tests/engine/live.py) on the tiny vision pair: an image is one
prefill item of a step (Plan.image) beside the decoding rows; the prefix cache compares an image's
span by its hash; an encoder that fails ends that request alone; a cancel leaves the KV cache
consistent. The KV cache is checked against the slots' bookkeeping after every step."""
from __future__ import annotations

from typing import Any

import pytest

from ggufdesk.core import images as img
from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.batching.scheduler import Plan
from ggufdesk.engine.batching.sequence import Sequence
from ggufdesk.engine.runtime.native import LlamaLog
from ggufdesk.engine.runtime.vision import Projector
from tests.engine.live import Live
from tests.fixtures.vision import ProjectorSpec, png_bytes, write_tiny_vision_pair

LOAD = LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=2,
                    prefill_chunk=8)
SPEC = ProjectorSpec()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    model, mmproj = write_tiny_vision_pair(tmp_path_factory.mktemp("vloop"))
    lv = Live(model, LOAD)
    lv.projector = Projector(str(mmproj), lv.lm, LlamaLog())  # type: ignore[attr-defined]
    yield lv
    lv.projector.close()  # type: ignore[attr-defined]
    lv.close()


@pytest.fixture
def plans(live, monkeypatch) -> list[tuple[int, Any, bool]]:
    """Each step's plan as (decode rows, image, whether its text chunk runs into an image)."""
    seen: list[tuple[int, Any, bool]] = []
    schedule = live.engine.schedule

    def recording() -> Plan[Sequence]:
        plan = schedule()
        p, crosses = plan.prefill, False
        if p is not None and p.media is not None and plan.image is None:
            crosses = any(p.n_done <= s.start < p.n_done + plan.chunk for s in p.media.spans)
        seen.append((len(plan.decode), plan.image, crosses))
        return plan

    monkeypatch.setattr(live.engine, "schedule", recording)
    return seen


def image_seq(live: Live, data: bytes, max_tokens: int = 6, text: str = "what is this") -> Sequence:
    proj = live.projector  # type: ignore[attr-defined]
    media = proj.tokenize(f"user: {proj.marker} {text}\nassistant:", [img.decode(data)], add_special=True)
    seq = live.sequence(media.tokens, max_tokens)
    seq.media = media
    return seq


def test_an_image_is_one_prefill_item_beside_the_decoding_rows(live, plans):
    live.forget()
    text = live.sequence("tell me about the red house " * 2, 30)
    pic = image_seq(live, png_bytes(seed=21))
    both = live.run(text, pic, on_step=Live.check_kv)
    images = [(rows, span) for rows, span, _ in plans if span is not None]
    assert len(images) == 1 and images[0][1].n_tokens == SPEC.n_image_tokens
    assert images[0][0] == 1  # the text answer's row decoded in the image's step
    assert not any(crosses for _, _, crosses in plans)  # a text chunk stops at the next image
    assert both[1].done is not None and both[1].done.usage["images_encoded"] == 1
    live.forget()
    alone_text = live.plain("tell me about the red house " * 2, 30)
    live.forget()
    alone_pic = live.run(image_seq(live, png_bytes(seed=21)))[0]
    assert both[0].tokens == alone_text.tokens and both[1].tokens == alone_pic.tokens
    assert alone_pic.done is not None and alone_pic.done.usage["images_cached"] == 1  # encoded once


def test_the_prefix_cache_compares_images_by_hash(live):
    live.forget()
    first = live.run(image_seq(live, png_bytes(seed=31)), on_step=Live.check_kv)[0]
    same = image_seq(live, png_bytes(seed=31), text="what is this now")
    again = live.run(same, on_step=Live.check_kv)[0]
    span = same.media.spans[0]
    assert first.error is None and again.stats is not None and again.stats.n_reused > span.end
    assert again.done is not None and again.done.usage["images_encoded"] == 0  # not decoded again
    other = image_seq(live, png_bytes(seed=32), text="what is this now")  # same size, other pixels
    third = live.run(other, on_step=Live.check_kv)[0]
    assert third.stats is not None and third.stats.n_reused <= other.media.spans[0].start
    assert third.done is not None and third.done.usage["images_encoded"] == 1


def test_an_encoder_failure_ends_that_request_alone(live, monkeypatch):
    live.forget()
    proj = live.projector  # type: ignore[attr-defined]

    def broken(span: Any) -> Any:
        raise KnownError("the projector could not encode the image (error 1)")

    monkeypatch.setattr(proj, "embedding", broken)
    text = live.sequence("tell me about the red house " * 2, 20)
    pic = image_seq(live, png_bytes(seed=41))
    got = live.run(text, pic, on_step=Live.check_kv)
    assert got[1].error is not None and "could not encode" in got[1].error.message
    assert got[0].error is None and got[0].done is not None
    monkeypatch.undo()
    live.forget()
    assert got[0].tokens == live.plain("tell me about the red house " * 2, 20).tokens
    assert live.run(image_seq(live, png_bytes(seed=41)))[0].error is None  # the projector works on


def test_a_cancel_at_the_image_leaves_the_cache_consistent(live, plans):
    live.forget()
    pic = image_seq(live, png_bytes(seed=51), max_tokens=20)

    def cancel_at_the_image(lv: Live) -> None:
        lv.check_kv()
        if any(span is not None for _, span, _ in plans):
            lv.cancels.add(pic.rid)

    got = live.run(pic, on_step=cancel_at_the_image)[0]
    live.cancels.clear()
    assert got.done is not None and got.done.finish_reason == "cancelled"
    assert live.run(image_seq(live, png_bytes(seed=51)), on_step=Live.check_kv)[0].error is None
