"""The images of the chat history, in the data directory by content hash: images/ab/abcdef….png.

A message names its images by sha256 (Message.stats["images"]); the files live here, once each
however many messages show them, written atomically (a crash leaves no half file under a hash
name) and checked against their name when read back (a damaged file reads as missing, never as
another image).
"""
from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

from ggufdesk.core import images as img
from ggufdesk.core.atomic import write_atomic
from ggufdesk.core.errors import KnownError

log = logging.getLogger("ggufdesk.history")

_SHA = re.compile(r"^[0-9a-f]{64}$")
_EXT = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp"}


class ImageStore:
    """Image files by sha256 under `root` (None: kept in memory, as a memory-only history)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._memory: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, data: bytes) -> str:
        """Store an image's bytes (checked: format, size, pixels); returns its sha256. KnownError when
        the image is refused or cannot be written."""
        fmt, _, _ = img.check(data)
        key = img.sha256(data)
        if self.root is None:
            with self._lock:
                self._memory[key] = data
            return key
        path = self._path(key, _EXT.get(fmt, ".img"))
        if path.exists():
            return key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
        except OSError as e:
            raise KnownError(f"could not save the image in {path.parent}: {e.strerror or e}") from e
        return key

    def get(self, key: str) -> bytes | None:
        """The image's bytes, or None when it is missing or damaged."""
        if self.root is None:
            return self._memory.get(key)
        path = self.path(key)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except OSError as e:
            log.warning("cannot read the image %s: %s", path, e)
            return None
        if img.sha256(data) != key:
            log.warning("the image %s is damaged (its content does not match its name)", path)
            return None
        return data

    def path(self, key: str) -> Path | None:
        """The file holding the image, or None."""
        if self.root is None or not _SHA.match(key):
            return None
        folder = self.root / key[:2]
        for ext in _EXT.values():
            p = folder / (key + ext)
            if p.exists():
                return p
        return None

    def _path(self, key: str, ext: str) -> Path:
        assert self.root is not None and _SHA.match(key)
        return self.root / key[:2] / (key + ext)


def images_of(stats: dict[str, object]) -> list[str]:
    """A message's image keys (stats["images"]), each a sha256; anything else is left out."""
    keys = stats.get("images") if isinstance(stats, dict) else None
    return [k for k in keys if isinstance(k, str) and _SHA.match(k)] if isinstance(keys, list) else []
