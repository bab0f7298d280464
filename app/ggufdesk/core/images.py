"""Images for vision models: checked, decoded in a bounded way and normalised to RGB pixels.

One function, `decode`, is used at every edge (the server's request parsers, the window's composer,
`ggufdesk run --image`) and again in the engine, so a bad file gets the same clear refusal wherever
it enters. The checks run before the pixels are decoded: the size of the upload, the format (PNG,
JPEG, WebP, a still GIF or BMP; not an animation), the pixel count the header declares (a PNG can
declare 100k x 100k and hold a few bytes: a decompression bomb). Then the pixels are decoded (a
truncated file is an error, not a grey half), turned as the EXIF orientation says, converted to RGB
(transparency over white) and scaled down to MAX_SIDE, which is beyond what any projector reads.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from dataclasses import dataclass

from typing import TYPE_CHECKING

from ggufdesk.core.errors import KnownError

if TYPE_CHECKING:
    from PIL import Image

MAX_BYTES = 20 * 1024 * 1024  # an upload larger than this is refused (OpenAI's limit per image)
MAX_PIXELS = 50_000_000  # what the header may declare (a 50 MP photo); more is refused unread
MAX_SIDE = 4096  # pixels kept per side after decoding (projectors read 224-1024; tiles up to ~2k)
MAX_IMAGES = 16  # images in one request
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif", "BMP": "image/bmp"}
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,", re.I)


class ImageError(KnownError):
    """An image that cannot be used, said plainly (the server answers 400)."""


@dataclass(frozen=True)
class Pixels:
    """A decoded image: RGB bytes, row by row, width * height * 3 of them."""

    width: int
    height: int
    rgb: bytes
    sha256: str  # of the file's bytes, not of the pixels
    format: str


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_size(n: int) -> None:
    if n > MAX_BYTES:
        raise ImageError(f"the image is {n / 1e6:.1f} MB; images up to {MAX_BYTES // (1024 * 1024)} MB are accepted")
    if n == 0:
        raise ImageError("the image is empty")


def from_base64(text: str) -> bytes:
    """Bytes of a base64 string or a data: URL (checked for size before decoding)."""
    m = _DATA_URL.match(text)
    if m:
        text = text[m.end():]
    elif text.startswith("data:"):
        raise ImageError("only base64 data: URLs are accepted (data:image/png;base64,...)")
    if len(text) * 3 // 4 > MAX_BYTES + 3:
        check_size(len(text) * 3 // 4)
    try:
        data = base64.b64decode(text.strip(), validate=False)
    except (binascii.Error, ValueError):
        raise ImageError("the image's base64 data cannot be decoded") from None
    check_size(len(data))
    return data


def to_data_url(data: bytes, fmt: str | None = None) -> str:
    mime = MIME.get((fmt or sniff(data) or "PNG").upper(), "image/png")
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def sniff(data: bytes) -> str | None:
    """The format by the file's first bytes (PNG, JPEG, WEBP, GIF, BMP), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data.startswith(b"BM"):
        return "BMP"
    return None


def check(data: bytes) -> tuple[str, int, int]:
    """Format, width and height from the header, without decoding the pixels; ImageError if refused."""
    from PIL import Image, UnidentifiedImageError

    check_size(len(data))
    if sniff(data) is None:
        raise ImageError("this is not an image ggufdesk can read (PNG, JPEG, WebP, GIF or BMP)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError("the image declares too many pixels (a decompression bomb?)") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ImageError(f"the image cannot be read: {e}") from None
    with img:
        w, h = img.size
        fmt = img.format or "?"
        frames = getattr(img, "n_frames", 1)
    if w <= 0 or h <= 0:
        raise ImageError("the image has no pixels")
    if w * h > MAX_PIXELS:
        raise ImageError(f"the image is {w} x {h} pixels; images up to {MAX_PIXELS // 1_000_000} megapixels "
                         "are accepted")
    if frames > 1:
        raise ImageError(f"the image is an animation ({frames} frames); send a still image")
    return fmt, w, h


def decode(data: bytes, *, max_side: int = MAX_SIDE) -> Pixels:
    """Check, decode, orient and convert an image file's bytes to RGB pixels; ImageError if refused."""
    from PIL import Image, ImageOps

    fmt, w, h = check(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=FORMATS)
            opened.draft("RGB", (max_side, max_side))  # JPEG: decode at a reduced scale when much larger
            opened.load()
            img = _rgb(ImageOps.exif_transpose(opened) or opened)
            if max(img.size) > max_side:
                img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
            rgb = img.tobytes()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ImageError(f"the image cannot be decoded ({fmt}, {w} x {h}): {e}") from None
    return Pixels(width=img.width, height=img.height, rgb=rgb, sha256=sha256(data), format=fmt)


def _rgb(img: Image.Image) -> Image.Image:
    """The image in RGB, transparency over white."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.getchannel("A"))
        return white
    return img.convert("RGB")


def thumbnail_png(data: bytes, side: int = 256) -> bytes:
    """A small PNG of an image (for the window's thumbnails and exports' previews)."""
    from PIL import Image

    px = decode(data, max_side=side)
    buf = io.BytesIO()
    Image.frombytes("RGB", (px.width, px.height), px.rgb).save(buf, "PNG")
    return buf.getvalue()
