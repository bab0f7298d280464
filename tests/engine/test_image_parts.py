"""A text-only chat request must not load libmtmd: engine/runtime/image_parts.py answers "are there
images?" without engine/runtime/vision.py, whose import loads libmtmd (llama_cpp.mtmd_cpp) on a fresh
engine's way to its first token."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.image_parts import IMAGES_KEY, flatten, has_images, images_of, without_keys


def test_asking_for_images_does_not_load_libmtmd() -> None:
    code = ("import sys\n"
            "from ggufdesk.engine.runtime import worker\n"
            "from ggufdesk.engine.runtime.image_parts import has_images, without_keys\n"
            "msgs = [{'role': 'user', 'content': 'hi'}]\n"
            "assert not has_images(msgs) and without_keys(msgs) == msgs\n"
            "print(sorted(m for m in sys.modules if 'mtmd' in m or m.endswith('runtime.vision')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_image_parts_flatten_to_markers_in_order() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "image", "image": "k1"},
                                         {"type": "image", "image": "k2"}]},
            {"role": "assistant", "content": "ok"}]
    assert has_images(msgs) and not has_images([msgs[1]]) and not has_images(None)
    flat, keys = flatten(msgs, "<img>")
    assert keys == ["k1", "k2"] == images_of(flat)
    assert flat[0]["content"] == "a <img><img>" and flat[0][IMAGES_KEY] == ["k1", "k2"]
    assert without_keys(flat) == [{"role": "user", "content": "a <img><img>"}, msgs[1]]


@pytest.mark.parametrize("part", [{"type": "image"}, {"type": "image", "image": ""}])
def test_an_image_part_without_its_image_is_an_image_error(part: dict) -> None:
    with pytest.raises(P.EngineRequestError) as e:
        flatten([{"role": "user", "content": [part]}], "<img>")
    assert e.value.kind == "image"


def test_a_part_of_unknown_type_is_refused_with_its_text() -> None:
    from ggufdesk.core.errors import KnownError

    with pytest.raises(KnownError, match="bad message part"):
        flatten([{"role": "user", "content": [{"type": "audio", "data": "x"}]}], "<img>")
