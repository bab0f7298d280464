"""server/images.py without a server: the shapes each API gives images in, and their refusals."""
from __future__ import annotations

import base64

import pytest

from ggufdesk.core import images as img
from ggufdesk.server.errors import ApiError
from ggufdesk.server.images import RequestImages, ollama_content, responses_image, with_text
from tests.fixtures.vision import png_bytes


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_ollama_images_become_parts_before_the_text():
    found = RequestImages()
    data = png_bytes()
    content = ollama_content("what is this", [b64(data)], "messages[0]", found)
    assert content == [{"type": "image", "image": img.sha256(data)}, {"type": "text", "text": "what is this"}]
    assert base64.b64decode(found.files[img.sha256(data)]) == data
    assert ollama_content("plain", None, "messages[0]", found) == "plain"
    with pytest.raises(ApiError, match="list of base64"):
        ollama_content("x", b64(data), "messages[0]", found)
    with pytest.raises(ApiError, match="not an image"):
        ollama_content("x", [b64(b"hello" * 30)], "messages[1]", found)


def test_responses_input_image():
    found = RequestImages()
    data = png_bytes(seed=1)
    url = "data:image/png;base64," + b64(data)
    assert responses_image({"type": "input_image", "image_url": url}, "input[0]", found)["image"] == img.sha256(data)
    assert responses_image({"type": "input_image", "image_url": {"url": url}}, "input[0]", found)["type"] == "image"
    with pytest.raises(ApiError, match="file_id"):
        responses_image({"type": "input_image", "file_id": "file-123"}, "input[1]", found)
    with pytest.raises(ApiError, match="--allow-remote-images"):
        responses_image({"type": "input_image", "image_url": "https://example.com/cat.png"}, "input[2]", found)


def test_the_same_image_twice_is_one_file_and_too_many_are_refused():
    found = RequestImages()
    data = png_bytes(seed=2)
    found.part_from_base64(b64(data), "a")
    found.part_from_base64(b64(data), "b")
    assert len(found.files) == 1
    with pytest.raises(ApiError, match=f"at most {img.MAX_IMAGES}"):
        for k in range(img.MAX_IMAGES + 1):
            found.part_from_base64(b64(png_bytes(8, 8, seed=100 + k)), f"c{k}")
    assert with_text([], "t") == "t" and with_text([{"type": "image", "image": "k"}], "") == [
        {"type": "image", "image": "k"}]
