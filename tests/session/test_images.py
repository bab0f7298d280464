"""Images in a conversation: sent with a message, stored in the data directory by hash, sent again with
later turns, shown as a note to a model that reads text only, and exported with the conversation."""
from __future__ import annotations

import base64
import json

import pytest

from ggufdesk.core import images as img
from ggufdesk.core.history import History
from ggufdesk.engine.link import protocol as P
from ggufdesk.session import ChatSession, Refused
from ggufdesk.session.prompt import MISSING, NOT_SHOWN
from tests.fixtures.vision import animated_gif, png_bytes


@pytest.fixture
def vrig(rig):
    rig.session.image_source = rig.history.images.get
    rig.session.on_event(P.Loaded(id="l2", model="/m/vision.gguf", chat_format="template", mmproj="/m/mmproj.gguf"))
    return rig


def send(rig, text, images=()):
    n = len(rig.engine.requests)
    rig.session.send(text, images=images)
    rig.until(lambda: len(rig.engine.requests) > n)
    return f"r{len(rig.engine.requests)}"


def test_an_image_is_stored_by_hash_and_sent_as_a_part(vrig):
    data = png_bytes()
    key = img.sha256(data)
    rid = send(vrig, "what is this", [data])
    req = vrig.engine.requests[-1]
    assert req["messages"] == [{"role": "user", "content": [{"type": "image", "image": key},
                                                             {"type": "text", "text": "what is this"}]}]
    assert base64.b64decode(req["images"][key]) == data
    vrig.answer(rid, "a cat")
    assert vrig.writer.flush(10)
    msgs = vrig.history.messages(vrig.session.conv.id)
    assert msgs[0].stats["images"] == [key]
    stored = vrig.history.images.path(key)
    assert stored.parent.parent == vrig.history.path.parent / "images" and stored.read_bytes() == data


def test_a_later_turn_sends_the_image_again_from_the_history(vrig, history, writer):
    data = png_bytes(seed=2)
    vrig.answer(send(vrig, "look", [data]), "ok")
    assert vrig.writer.flush(10)
    conv = vrig.session.conv
    # a fresh session (the app restarted) reads the image back from the store
    fresh = ChatSession(engine=vrig.engine, writer=writer, post=vrig.inbox.post, images=history.images.get)
    fresh.on_event(P.Loaded(id="l3", model="/m/vision.gguf", chat_format="template", mmproj="/m/p.gguf"))
    fresh.open(conv, history.messages(conv.id))
    n = len(vrig.engine.requests)
    fresh.send("and now?")
    vrig.until(lambda: len(vrig.engine.requests) > n)
    req = vrig.engine.requests[-1]
    assert req["messages"][0]["content"][0] == {"type": "image", "image": img.sha256(data)}
    assert base64.b64decode(req["images"][img.sha256(data)]) == data


def test_a_text_only_model_refuses_new_images_and_sees_a_note_for_old_ones(vrig):
    data = png_bytes(seed=3)
    vrig.answer(send(vrig, "look", [data]), "ok")
    vrig.session.on_event(P.Loaded(id="l4", model="/m/text.gguf", chat_format="template"))
    with pytest.raises(Refused, match="reads text only"):
        vrig.session.send("another", images=[png_bytes(seed=4)])
    send(vrig, "what did I show you?")
    first = vrig.engine.requests[-1]["messages"][0]
    assert first["content"][0] == {"type": "text", "text": NOT_SHOWN}
    assert "images" not in vrig.engine.requests[-1]


def test_bad_images_are_refused_before_anything_is_saved(vrig):
    for bad, words in ((animated_gif(), "animation"), (b"nope" * 100, "not an image")):
        with pytest.raises(Refused, match=words):
            vrig.session.send("x", images=[bad])
    assert vrig.session.turns == [] and vrig.engine.requests == []


def test_a_missing_image_file_is_a_note_not_a_failure(vrig, history):
    data = png_bytes(seed=5)
    vrig.answer(send(vrig, "look", [data]), "ok")
    assert vrig.writer.flush(10)
    history.images.path(img.sha256(data)).write_bytes(b"damaged")
    vrig.session._image_bytes.clear()
    send(vrig, "again")
    assert vrig.engine.requests[-1]["messages"][0]["content"][0] == {"type": "text", "text": MISSING}


def test_exports_include_the_images(vrig, history, tmp_path):
    data = png_bytes(seed=6)
    key = img.sha256(data)
    vrig.answer(send(vrig, "look at this", [data]), "a gradient")
    assert vrig.writer.flush(10)
    conv_id = vrig.session.conv.id
    exported = history.export_json(conv_id)
    assert exported["messages"][0]["stats"]["images"] == [key]
    assert img.from_base64(exported["images"][key]) == data
    json.dumps(exported)
    folder = tmp_path / "chat_images"
    md = history.export_markdown(conv_id, image_dir=folder)
    name = history.images.path(key).name
    assert f"![image](chat_images/{name})" in md and (folder / name).read_bytes() == data
    inline = history.export_markdown(conv_id)
    assert "![image](data:image/png;base64," in inline


def test_an_edited_message_keeps_its_images(vrig):
    data = png_bytes(seed=7)
    vrig.answer(send(vrig, "look", [data]), "ok")
    key = vrig.session.turns[0].key
    assert vrig.session.edit(key) == "look"
    assert vrig.session.images_of(key) == [data]


def test_a_memory_history_keeps_images_in_memory():
    h = History(memory=True)
    key = h.images.put(png_bytes())
    assert h.images.get(key) == png_bytes() and h.images.path(key) is None


def test_a_full_disk_holds_the_message_until_the_image_is_saved(vrig, monkeypatch):
    real, fails = vrig.history.images.put, []

    def flaky(data):
        if len(fails) < 2:
            fails.append(1)
            from ggufdesk.core.errors import KnownError

            raise KnownError("could not save the image: No space left on device")
        return real(data)

    monkeypatch.setattr(vrig.history.images, "put", flaky)
    data = png_bytes(seed=9)
    send(vrig, "after the disk frees up", [data])
    assert len(fails) == 2 and any(s.reason and "No space" in s.reason for s in vrig.view.save_states)
    assert vrig.history.images.get(img.sha256(data)) == data  # saved before the engine was asked
