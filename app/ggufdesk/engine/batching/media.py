"""Images in a prompt, as the step loop sees them: spans of placeholder ids, each one prefill item.

A prompt with images is still a list of token ids: each image stands as `n_tokens` copies of a
negative id derived from the image's sha256 (`placeholder_id`). So the prefix cache
(engine/batching/prefix_cache.py) compares prompts with images like any other: the same image at
the same place matches, another image does not. A negative id never reaches llama.cpp as a token:
when prefill reaches a span, the step decodes the image's embeddings instead (the projector,
engine/runtime/vision.py), the whole span at once; text chunks stop at the next span.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol


def placeholder_id(key: str) -> int:
    """The id an image's positions hold in a prompt: negative (no vocabulary has it), from its sha256."""
    try:
        h = int(key[:8], 16)
    except ValueError:
        h = hash(key) & 0x7FFFFFFF
    return -1 - (h & 0x3FFFFFFF)


def text_only(tokens: list[int]) -> list[int]:
    """The tokens without image placeholders (for what reads token ids: samplers, n-gram lookup)."""
    return [t for t in tokens if t >= 0]


@dataclass
class ImageSpan:
    start: int  # index of its first placeholder in the prompt
    n_tokens: int
    key: str  # the image file's sha256
    handle: Any = None  # the projector's chunk (freed when the prompt is done with)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


class Decoder(Protocol):
    """What a MediaPrompt needs of its projector (engine/runtime/vision.py Projector)."""

    def embedding(self, span: ImageSpan) -> tuple[Any, bool]: ...  # (embeddings, taken from the cache)

    def decode(self, span: ImageSpan, embd: Any, *, n_past: int, seq_id: int) -> int: ...

    @staticmethod
    def release(span: ImageSpan) -> None: ...


@dataclass(eq=False)
class MediaPrompt:
    """A tokenized prompt with images: its tokens (placeholders included) and the image spans."""

    tokens: list[int]
    spans: list[ImageSpan]
    projector: Decoder
    n_encoded: int = 0  # images this request encoded (0 when the cache or the KV cache had them)
    n_cached: int = 0  # images it took from the embedding cache
    _done: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        # the chunks hold the preprocessed images: free them when the prompt is dropped, whatever ended it
        weakref.finalize(self, _release_all, self.projector, list(self.spans))

    @property
    def image_tokens(self) -> int:
        return sum(s.n_tokens for s in self.spans)

    def span_at(self, pos: int) -> ImageSpan | None:
        """The image whose first position is pos."""
        return next((s for s in self.spans if s.start == pos), None)

    def text_room(self, pos: int, chunk: int) -> int:
        """How many tokens from pos a text chunk may take: up to the next image."""
        nxt = min((s.start for s in self.spans if s.start >= pos), default=None)
        return chunk if nxt is None else max(0, min(chunk, nxt - pos))

    def align(self, n_reused: int) -> int:
        """A reused prefix ending inside an image is cut back to the image's start (an image is
        decoded whole or not at all)."""
        for s in self.spans:
            if s.start < n_reused < s.end:
                return s.start
        return n_reused

    def prefill(self, span: ImageSpan, *, n_past: int, seq_id: int) -> int:
        """Encode (or take from the cache) and decode one image; llama_decode's return code."""
        embd, cached = self.projector.embedding(span)
        if span.start not in self._done:  # (a decode aborted by a cancel is tried again: count once)
            self._done.add(span.start)
            if cached:
                self.n_cached += 1
            else:
                self.n_encoded += 1
        rc = self.projector.decode(span, embd, n_past=n_past, seq_id=seq_id)
        if rc == 0:
            self.projector.release(span)  # its embeddings are cached; the preprocessed pixels can go
        return rc


def _release_all(projector: Decoder, spans: list[ImageSpan]) -> None:
    for s in spans:
        projector.release(s)
