"""Images through the engine: a tiny text model with a tiny random-weight gemma3-type projector.

load -> encode -> prefill -> decode, the image token count the projector's hparams give, the
embedding cache on a second turn, and hostile images answered with clear 'image' errors while the
engine lives on.
"""
from __future__ import annotations

import base64

import pytest

from ggufdesk.core import images as img
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.link.client import EngineClient
from tests.engine.helpers import collect, greedy
from tests.fixtures.vision import (ProjectorSpec, animated_gif, png_bomb, png_bytes, rotated_jpeg, truncated_jpeg,
                                   write_tiny_vision_pair)

LOAD = LoadSettings(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1, n_parallel=2)
SPEC = ProjectorSpec()
MARKERS = 2  # <start_of_image> and <end_of_image>, the text model's own tokens


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_tiny_vision_pair(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def vengine(pair):
    model, mmproj = pair
    client = EngineClient(auto_restart=True)
    client.start()
    loaded = client.load(str(model), settings=LOAD, mmproj=str(mmproj))
    client.loaded_event = loaded
    yield client
    client.shutdown()


def image_message(data: bytes, text: str = "what is this") -> tuple[list[dict], dict[str, str]]:
    key = img.sha256(data)
    msgs = [{"role": "user", "content": [{"type": "text", "text": text + " "}, {"type": "image", "image": key}]}]
    return msgs, {key: base64.b64encode(data).decode()}


def ask(client, data: bytes, *, text: str = "what is this", history: list[dict] | None = None,
        earlier: tuple[bytes, ...] = (), **kw):
    msgs, images = image_message(data, text)
    for d in earlier:  # every turn sends the conversation's images again, as the APIs do
        images[img.sha256(d)] = base64.b64encode(d).decode()
    rid = client.generate(messages=(history or []) + msgs, images=images, sampling=greedy(8), **kw)
    return collect(client, rid)


def test_loaded_reports_the_projector(vengine, pair):
    ev = vengine.loaded_event
    assert ev.mmproj == str(pair[1])
    assert ev.image_tokens == SPEC.n_image_tokens + MARKERS
    assert ev.memory["projector"] > 0


def test_an_image_goes_through_encode_prefill_decode(vengine):
    r = ask(vengine, png_bytes(seed=1))
    assert r.error is None, r.error
    assert r.done.finish_reason in ("stop", "length")
    u = r.done.usage
    assert u["images"] == 1 and u["image_tokens"] == SPEC.n_image_tokens  # (image_size/patch/n_merge)^2 = 16
    assert u["images_encoded"] == 1 and u["images_cached"] == 0
    # the prompt counts the image's placeholders: text + markers + 16
    text_only = collect(vengine, vengine.generate(messages=[{"role": "user", "content": "what is this "}],
                                                  sampling=greedy(1)))
    assert u["prompt_tokens"] == text_only.done.usage["prompt_tokens"] + SPEC.n_image_tokens + MARKERS


def test_a_second_turn_does_not_encode_again(vengine):
    data = png_bytes(seed=2)
    first = ask(vengine, data)
    assert first.done.usage["images_encoded"] == 1
    history = [image_message(data)[0][0], {"role": "assistant", "content": first.done.text or "ok"}]
    second = ask(vengine, png_bytes(seed=3), text="and this", history=history, earlier=(data,))
    assert second.error is None, second.error
    u = second.done.usage
    assert u["images"] == 2
    assert u["images_encoded"] == 1  # only the new image; the first came from the KV prefix or the cache
    assert second.stats.n_reused > SPEC.n_image_tokens  # the first turn's image stayed in the KV cache


def test_the_image_is_what_the_model_reads(vengine):
    a1, b = ask(vengine, png_bytes(seed=10), text="describe"), ask(vengine, png_bytes(seed=11), text="describe")
    a2 = ask(vengine, png_bytes(seed=10), text="describe")  # the KV prefix holds the image this time
    assert a1.done.tokens == a2.done.tokens
    assert a1.done.tokens != b.done.tokens  # another image, another answer (random weights, greedy)


def test_the_embedding_cache_hits_when_the_kv_cache_lost_the_image(vengine):
    data = png_bytes(seed=4)
    first = ask(vengine, data)
    assert first.done.usage["images_encoded"] == 1
    # two requests that reuse no prefix take the least valuable slot each (empty, else least recently
    # used), so one after the other they take both: the image's KV cells are gone. (Sent at once, they
    # took both only when the second arrived before the first ended: the test failed when run first.)
    for w in ("hello", "world"):
        collect(vengine, vengine.generate(messages=[{"role": "user", "content": f"{w} " * 50}], sampling=greedy(2),
                                          cache_prompt=False))
    again = ask(vengine, data)
    assert again.error is None, again.error
    assert again.stats.n_reused < SPEC.n_image_tokens  # the KV cells were gone
    assert again.done.usage["images_cached"] == 1 and again.done.usage["images_encoded"] == 0
    assert again.done.tokens == first.done.tokens  # cached embeddings read as the fresh ones


def test_the_same_image_twice_in_one_prompt(vengine):
    data = png_bytes(seed=5)
    key = img.sha256(data)
    msgs = [{"role": "user", "content": [{"type": "image", "image": key}, {"type": "text", "text": " and "},
                                         {"type": "image", "image": key}, {"type": "text", "text": " same?"}]}]
    r = collect(vengine, vengine.generate(messages=msgs, images={key: base64.b64encode(data).decode()},
                                          sampling=greedy(4)))
    assert r.error is None, r.error
    assert r.done.usage["images"] == 2 and r.done.usage["images_encoded"] + r.done.usage["images_cached"] == 2


def test_exif_orientation_and_formats(vengine):
    for data in (rotated_jpeg(), png_bytes(fmt="WEBP"), png_bytes(fmt="JPEG")):
        r = ask(vengine, data)
        assert r.error is None, r.error


@pytest.mark.parametrize("name, data, words", [
    ("bomb", png_bomb(), "too many pixels"),
    ("truncated", truncated_jpeg(), "cannot be decoded"),
    ("not an image", b"<html>not a png</html>" * 50, "not an image"),
    ("animated", animated_gif(), "animation"),
])
def test_hostile_images_are_clear_errors_and_the_engine_lives(vengine, name, data, words):
    r = ask(vengine, data)
    assert r.error is not None and r.error.kind == "image", (name, r)
    assert words in r.error.message
    ok = ask(vengine, png_bytes(seed=9))
    assert ok.error is None


def test_a_missing_or_mismatched_image_is_refused(vengine):
    data = png_bytes(seed=6)
    msgs, _ = image_message(data)
    r = collect(vengine, vengine.generate(messages=msgs, images={}, sampling=greedy(2)))
    assert r.error.kind == "image" and "does not send it" in r.error.message
    other = base64.b64encode(png_bytes(seed=7)).decode()
    r = collect(vengine, vengine.generate(messages=msgs, images={img.sha256(data): other}, sampling=greedy(2)))
    assert r.error.kind == "image" and "sha256" in r.error.message


def test_a_cancel_during_the_image_prefill(vengine):
    msgs, images = image_message(png_bytes(seed=8))
    rid = vengine.generate(messages=msgs, images=images, sampling=greedy(50))
    vengine.cancel(rid)
    r = collect(vengine, rid)
    assert (r.done is not None and r.done.finish_reason in ("cancelled", "stop", "length")) or r.error is None
    assert ask(vengine, png_bytes(seed=8)).error is None


def test_a_text_only_model_refuses_images(engine):
    r = ask(engine, png_bytes())
    assert r.error is not None and r.error.kind == "image"
    assert "reads text only" in r.error.message


def load_with(model, mmproj) -> tuple[P.Loaded, list[str]]:
    """Load `model` with the projector `mmproj` in a fresh engine: the Loaded event and the projector notices."""
    client = EngineClient()
    client.start()
    try:
        events: list = []
        client.on_event = events.append
        loaded = client.load(str(model), settings=LOAD, mmproj=str(mmproj))
        return loaded, [e.message for e in events if isinstance(e, P.Error) and e.kind == "projector"]
    finally:
        client.shutdown()


def test_a_broken_projector_is_a_notice_and_the_model_reads_text(tmp_path, pair):
    bad = tmp_path / "mmproj-broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 100)
    loaded, notices = load_with(pair[0], bad)
    assert loaded.mmproj is None and notices and "text only" in notices[0]


def test_a_projector_of_another_width_is_refused_at_load(tmp_path, pair):
    from tests.fixtures.vision import write_tiny_projector

    wrong = write_tiny_projector(tmp_path / "mmproj-wide.gguf", ProjectorSpec(text_n_embd=128))
    loaded, notices = load_with(pair[0], wrong)
    assert loaded.mmproj is None and notices and ("mismatch" in notices[0] or "n_embd" in notices[0])


def test_the_projector_beside_the_model_is_found_and_can_be_declined(pair):
    model, mmproj = pair
    client = EngineClient()
    client.start()
    try:
        assert client.load(str(model), settings=LOAD).mmproj == str(mmproj)  # None: the one beside it
        assert client.load(str(model), settings=LOAD, mmproj="").mmproj is None
        r = ask(client, png_bytes())
        assert r.error.kind == "image" and "reads text only" in r.error.message
    finally:
        client.shutdown()


def test_the_bench_runs_on_the_tiny_pair_and_removes_it(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where it writes the tiny pair (left behind by every run before)
    for extra in ([], ["--json"]):
        r = subprocess.run([sys.executable, str(root / "bench" / "vision.py"), "--repeat", "1", "--threads", "1",
                            *extra], capture_output=True, text=True, timeout=600, cwd=root, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert list(tmp_path.iterdir()) == []
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["image_tokens"] == SPEC.n_image_tokens
    assert out["encode_ms"] > 0 and out["text_ms"] > 0 and out["encode_over_text"] > 0


def test_an_image_prefills_while_another_request_decodes(vengine):
    """The image's step decodes the running sequence's row first (sampled before the image's own call,
    which leaves no logits): both answers are the ones each gets alone."""
    text = [{"role": "user", "content": "tell me about the red house " * 3}]
    rid_text = vengine.generate(messages=text, sampling=greedy(40))
    msgs, images = image_message(png_bytes(seed=13), "and the picture")
    rid_image = vengine.generate(messages=msgs, images=images, sampling=greedy(8))
    both_text, both_image = collect(vengine, rid_text), collect(vengine, rid_image)
    assert both_text.error is None and both_image.error is None
    assert both_image.done.usage["images_encoded"] == 1  # the image was prefilled beside the text answer
    alone = collect(vengine, vengine.generate(messages=text, sampling=greedy(40)))
    image_alone = ask(vengine, png_bytes(seed=13), text="and the picture")
    assert both_text.done.tokens == alone.done.tokens
    assert both_image.done.tokens == image_alone.done.tokens


def test_a_killed_engine_mid_image_is_reported_and_reloads_with_its_projector(pair):
    """SIGKILL while an image request is in flight: its Error says so, the engine restarts with the
    same model and projector, and the next image is answered. The engine is stopped (SIGSTOP) before
    the request goes out, so it cannot finish it first however late this thread runs (a loaded
    machine's test once read the first event only after the whole answer was done)."""
    import os
    import signal
    import time

    model, mmproj = pair
    client = EngineClient(auto_restart=True)
    client.start()
    try:
        client.load(str(model), settings=LOAD, mmproj=str(mmproj))
        old = client.pid
        msgs, images = image_message(png_bytes(seed=61))
        os.kill(old, signal.SIGSTOP)
        # kill() returns before a process running on another CPU has stopped: wait until it has, else it
        # may read the request, answer it and keep its prompt in the disk cache for the new engine to
        # restore (seen once in a full run: the next answer encoded no image)
        stat = f"/proc/{old}/stat"
        stop_by = time.monotonic() + 60
        while os.path.exists(stat) and open(stat).read().rsplit(")", 1)[1].split()[0] not in "Tt" \
                and time.monotonic() < stop_by:
            time.sleep(0.01)
        rid = client.generate(messages=msgs, images=images, sampling=greedy(400))
        os.kill(old, signal.SIGKILL)
        events = list(client.stream(rid))
        assert isinstance(events[-1], P.Error) and events[-1].kind == "crash" and "SIGKILL" in events[-1].message
        deadline = time.monotonic() + 120  # a hang guard, generous for a busy machine
        while (client.loaded is None or client.pid == old) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.pid != old and client.loaded is not None and client.loaded.mmproj == str(mmproj)
        r = ask(client, png_bytes(seed=61))
        assert r.error is None and r.done.usage["images_encoded"] == 1  # the new engine's cache is empty
    finally:
        client.shutdown()
