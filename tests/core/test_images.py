"""core/images.py: the checks before decoding, bounded decoding, orientation, and base64/data: URLs."""
from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from ggufdesk.core import images as img
from tests.fixtures.vision import animated_gif, png_bomb, png_bytes, rotated_jpeg, truncated_jpeg


def test_formats_decode_to_rgb():
    for fmt in ("PNG", "JPEG", "WEBP", "BMP", "GIF"):
        px = img.decode(png_bytes(40, 30, fmt=fmt))
        assert (px.width, px.height, px.format) == (40, 30, fmt)
        assert len(px.rgb) == 40 * 30 * 3


@pytest.mark.parametrize("data, words", [
    (png_bomb(), "too many pixels"),
    (png_bomb(8000, 7000), "megapixels"),  # 56 MP: under Pillow's own bomb limit, over ours
    (truncated_jpeg(), "cannot be decoded"),
    (b"GIF89a" + b"\0" * 40, "cannot be read"),
    (b"hello, not an image" * 20, "not an image"),
    (animated_gif(), "animation"),
    (b"", "empty"),
    (b"\xff\xd8\xff" + bytes(21 * 1024 * 1024), "images up to 20 MB"),
])
def test_refusals_say_why(data, words):
    with pytest.raises(img.ImageError, match=words):
        img.decode(data)


def test_exif_orientation_is_applied():
    px = img.decode(rotated_jpeg(orientation=6, width=80, height=40))
    assert (px.width, px.height) == (40, 80)


def test_transparency_goes_over_white_and_large_images_shrink():
    rgba = Image.new("RGBA", (5000, 100), (0, 0, 0, 0))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    px = img.decode(buf.getvalue())
    assert max(px.width, px.height) == img.MAX_SIDE
    assert px.rgb[:3] == b"\xff\xff\xff"


def test_base64_and_data_urls():
    data = png_bytes()
    b64 = base64.b64encode(data).decode()
    assert img.from_base64(b64) == data
    assert img.from_base64("data:image/png;base64," + b64) == data
    assert img.from_base64(img.to_data_url(data)) == data and img.to_data_url(data).startswith("data:image/png;")
    with pytest.raises(img.ImageError, match="base64 data: URLs"):
        img.from_base64("data:image/png,rawbytes")
    with pytest.raises(img.ImageError, match="20 MB"):
        img.from_base64("A" * (28 * 1024 * 1024))  # refused by its length, before decoding


def test_thumbnail_png():
    thumb = Image.open(io.BytesIO(img.thumbnail_png(png_bytes(400, 200), side=64)))
    assert thumb.size == (64, 32)
