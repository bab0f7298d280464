"""A chat request's images as the engine sees them before any projector: which messages carry image
parts, those parts flattened to the projector's marker, the images' bytes checked and decoded.

Apart from engine/runtime/vision.py because every chat request asks whether it has images, and
vision.py loads libmtmd (llama_cpp.mtmd_cpp), which a fresh engine's first text-only answer then loaded
before its first token. With this and the imports moved to the load (worker._REQUEST_MODULES), a fresh
`ggufdesk run --chat`'s time to first token went from 176 to 158 ms on SmolLM2-135M and from 89 to 70 ms
on the Gemma starter (bench/oneshot_ab.py, docs/bench/speculative-decoding.md).
"""
from __future__ import annotations

from typing import Any

from ggufdesk.core.errors import KnownError
from ggufdesk.core.images import Pixels
from ggufdesk.engine.link import protocol as P


def vision_refusal(message: str) -> P.EngineRequestError:
    """An image the loaded model cannot take: an Error of kind 'image' (the server's 400)."""
    return P.EngineRequestError("image", message)


IMAGES_KEY = "_images"  # a flattened message's image keys (taken off before the template sees it)


def has_images(messages: list[dict[str, Any]] | None) -> bool:
    return any(isinstance(m.get("content"), list) and any(_is_image(p) for p in m["content"])
               for m in messages or [] if isinstance(m, dict))


def _is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"


def flatten(messages: list[dict[str, Any]], marker: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages whose content is a list of parts ({"type": "text", "text"} / {"type": "image",
    "image": sha256}) as plain text with `marker` where each image goes, and the images' keys in order
    (each flattened message keeps its own under IMAGES_KEY)."""
    out: list[dict[str, Any]] = []
    keys: list[str] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            out.append(m)
            continue
        text: list[str] = []
        own: list[str] = []
        for part in content:
            if _is_image(part):
                key = part.get("image")
                if not isinstance(key, str) or not key:
                    raise vision_refusal("an image part names no image")
                own.append(key)
                text.append(marker)
            elif isinstance(part, dict) and part.get("type") == "text":
                text.append(str(part.get("text") or ""))
            else:
                raise KnownError(f"bad message part: {str(part)[:100]}")
        keys += own
        out.append({**m, "content": "".join(text), IMAGES_KEY: own})
    return out, keys


def images_of(messages: list[dict[str, Any]]) -> list[str]:
    """The images' keys of flattened messages, in the order their markers come."""
    return [k for m in messages for k in m.get(IMAGES_KEY, ())]


def without_keys(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != IMAGES_KEY} if IMAGES_KEY in m else m for m in messages]


def decode_images(keys: list[str], images: dict[str, str]) -> dict[str, Pixels]:
    """The request's images (base64 by sha256), checked and decoded once each; refusals are 'image' errors."""
    from ggufdesk.core import images as img

    if len(set(keys)) > img.MAX_IMAGES:
        raise vision_refusal(f"{len(set(keys))} images in one request; at most {img.MAX_IMAGES}")
    out: dict[str, Pixels] = {}
    for key in keys:
        if key in out:
            continue
        data = images.get(key)
        if data is None:
            raise vision_refusal(f"the request refers to image {key[:12]}… but does not send it")
        try:
            raw = img.from_base64(data)
            if img.sha256(raw) != key:
                raise img.ImageError(f"image {key[:12]}…'s data does not match its sha256")
            out[key] = img.decode(raw)
        except img.ImageError as e:
            raise vision_refusal(str(e)) from None
    return out
