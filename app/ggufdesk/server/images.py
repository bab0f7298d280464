"""Images in API requests: OpenAI `image_url` parts, Anthropic `image` blocks, Ollama `images`, Responses
`input_image`, all turned into the engine's image parts ({"type": "image", "image": sha256}) plus the
files by sha256.

Checked here, at the edge, so a bad image is a 400 before the request queues: the size, the format
and the pixel count its header declares (core/images.py check); the engine decodes them fully and
refuses what only decoding finds (a truncated JPEG) with an 'image' error, also a 400. A data: URL or
raw base64 is accepted; an http(s) URL is refused unless the server runs with --allow-remote-images,
and is then fetched with a size and a time limit, following no more than a few redirects.
"""
from __future__ import annotations

import asyncio
import base64
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import Request

from ggufdesk.core import images as img
from ggufdesk.server.errors import ApiError, invalid

FETCH_TIMEOUT_S = 10.0
MAX_REDIRECTS = 3
_T = TypeVar("_T")


def image_error(message: str, param: str | None = None) -> ApiError:
    return invalid(message, param=param, code="invalid_image")


class RequestImages:
    """The images of one request, collected while its messages are converted."""

    def __init__(self, *, allow_remote: bool = False) -> None:
        self.allow_remote = allow_remote
        self.files: dict[str, str] = {}  # sha256 -> base64 (what the engine's Generate.images carries)
        self.inline = 0  # characters of image data in the body (data: URLs, base64)
        self._remote: list[tuple[str, dict[str, Any], str]] = []  # (url, the part to fill in, where)

    def __bool__(self) -> bool:
        return bool(self.files or self._remote)

    def part_from_url(self, url: Any, where: str) -> dict[str, Any]:
        """An image given by URL (OpenAI, Responses): data:, raw base64, or http(s) when allowed."""
        if not isinstance(url, str) or not url:
            raise image_error(f"{where}: an image needs a url (a data: URL or base64)", where)
        if url.startswith(("http://", "https://")):
            if not self.allow_remote:
                raise image_error(f"{where}: image URLs are not fetched by this server; send the image as a "
                                  "data: URL (base64), or start it with --allow-remote-images", where)
            part: dict[str, Any] = {"type": "image", "image": ""}
            self._remote.append((url, part, where))
            return part
        return self.part_from_base64(url, where)

    def part_from_base64(self, data: Any, where: str) -> dict[str, Any]:
        """An image as base64 (Anthropic's source.data, Ollama's images[]) or a data: URL."""
        if not isinstance(data, str) or not data:
            raise image_error(f"{where}: the image has no data", where)
        self.inline += len(data)
        try:
            raw = img.from_base64(data)
        except img.ImageError as e:
            raise image_error(f"{where}: {e}", where) from None
        return self._add(raw, where)

    def _add(self, raw: bytes, where: str) -> dict[str, Any]:
        try:
            img.check(raw)
        except img.ImageError as e:
            raise image_error(f"{where}: {e}", where) from None
        key = img.sha256(raw)
        if key not in self.files and len(self.files) >= img.MAX_IMAGES:
            raise image_error(f"at most {img.MAX_IMAGES} images in one request", where)
        self.files.setdefault(key, base64.b64encode(raw).decode("ascii"))
        return {"type": "image", "image": key}

    async def fetch_remote(self) -> None:
        """Fetch the http(s) images (with --allow-remote-images), a few at a time, each bounded."""
        pending, self._remote = self._remote, []
        results = await asyncio.gather(*(asyncio.to_thread(fetch, url) for url, _, _ in pending),
                                       return_exceptions=True)
        for (_, part, where), got in zip(pending, results):
            if isinstance(got, BaseException):
                if isinstance(got, img.ImageError):
                    raise image_error(f"{where}: {got}", where)
                raise got
            part.update(self._add(got, where))


class _Redirects(urllib.request.HTTPRedirectHandler):
    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if not newurl.startswith(("http://", "https://")):
            raise img.ImageError(f"the image URL redirects to {newurl[:80]!r}, which is not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch(url: str, *, timeout: float = FETCH_TIMEOUT_S) -> bytes:
    """An image URL's bytes, at most img.MAX_BYTES of them, within `timeout` per read; ImageError otherwise."""
    opener = urllib.request.build_opener(_Redirects())
    req = urllib.request.Request(url, headers={"User-Agent": "ggufdesk", "Accept": "image/*"})
    try:
        with opener.open(req, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit():
                img.check_size(int(length))
            data: bytes = resp.read(img.MAX_BYTES + 1)
    except img.ImageError:
        raise
    except urllib.error.HTTPError as e:
        raise img.ImageError(f"fetching the image failed: HTTP {e.code} from {url[:120]}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise img.ImageError(f"fetching the image failed ({reason}): {url[:120]}") from None
    img.check_size(len(data))
    return data


def with_text(parts: list[dict[str, Any]], text: str) -> str | list[dict[str, Any]]:
    """A message's content: the text alone, or its image parts followed by the text."""
    if not parts:
        return text
    return parts + ([{"type": "text", "text": text}] if text else [])


def ollama_content(text: str, images: Any, where: str, found: RequestImages) -> str | list[dict[str, Any]]:
    """An Ollama message (or /api/generate prompt) and its `images` (a list of base64 strings)."""
    if not images:
        return text
    field = f"{where}.images" if where else "images"  # (/api/generate: the body's own field)
    if not isinstance(images, list):
        raise image_error(f"{field} must be a list of base64 strings", field)
    return with_text([found.part_from_base64(b, f"{field}[{k}]") for k, b in enumerate(images)], text)


def responses_image(part: dict[str, Any], where: str, found: RequestImages) -> dict[str, Any]:
    """A Responses API `input_image` part: image_url (a data: URL, or http(s) with --allow-remote-images);
    a file_id refers to an upload this server does not keep."""
    url = part.get("image_url")
    if isinstance(url, dict):  # (some clients nest it as Chat Completions does)
        url = url.get("url")
    if url is None and part.get("file_id"):
        raise image_error(f"{where}: file_id images are not kept by this server; send image_url as a data: URL",
                          where)
    return found.part_from_url(url, where)


async def with_images(request: Request, model_id: str, convert: Callable[..., _T],
                      req: Any) -> tuple[_T, dict[str, str]]:
    """A route's messages (convert(req, images), off the event loop: images are decoded and checked)
    and their images (sha256 -> base64); a 400 when the model cannot see them. The body was read under
    --max-image-body; without its images it keeps to --max-body (a 413 otherwise)."""
    from ggufdesk.server.http import body_too_large, off_loop, service

    svc = service(request)
    images = RequestImages(allow_remote=svc.config.allow_remote_images)
    messages = await off_loop(convert, req, images)
    limit = svc.config.max_body
    if getattr(request.state, "body_size", 0) - images.inline > limit:
        raise body_too_large(f"the request body is larger than {limit} bytes without its images")
    if images:
        require_vision(svc, model_id)
        await images.fetch_remote()
    return messages, images.files


def require_vision(svc: Any, model_id: str) -> None:
    """A 400 that says so when the served model reads text only."""
    loaded = getattr(svc.pool_for(model_id), "loaded", None)
    if loaded is not None and not getattr(loaded, "mmproj", None):
        raise invalid(f"the model {model_id!r} reads text only: it has no vision projector (mmproj), so it cannot "
                      "see images", param="messages", code="model_not_vision")
