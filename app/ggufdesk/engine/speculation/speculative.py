"""Making a request's drafter: prompt lookup (engine/speculation/lookup.py) or a draft model
(engine/speculation/draft_model.py), and what lookup reads from the model's vocabulary."""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Generic, TypeVar

import llama_cpp

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SpeculationSettings
from ggufdesk.engine.runtime.native import LoadedModel, token_piece
from ggufdesk.engine.speculation.draft_model import DraftModel, DraftModelDrafter
from ggufdesk.engine.speculation.drafter import Drafter
from ggufdesk.engine.speculation.lookup import NgramCache, PromptLookup

Fact = TypeVar("Fact")


class _Pieces(Generic[Fact]):
    """Something read from each token's text in the model's vocabulary, once per token."""

    def __init__(self, lm: LoadedModel) -> None:
        self.vocab = lm.vocab
        self._known: dict[int, Fact] = {}
        self._buf = ctypes.create_string_buffer(64)

    def _read(self, piece: bytes) -> Fact:
        raise NotImplementedError

    def __call__(self, token: int) -> Fact:
        try:
            return self._known[token]
        except KeyError:
            known = self._known[token] = self._read(token_piece(self.vocab, token, self._buf))
            return known


class SentenceEnds(_Pieces[bool]):
    """Does a token end a sentence or a line (its text ends in . ! ? before closing quotes, or holds a
    newline)?"""

    def _read(self, piece: bytes) -> bool:
        return b"\n" in piece or piece.rstrip(b" \"')").endswith((b".", b"!", b"?"))


class QuoteMarks(_Pieces[tuple[bool, str]]):
    """The double quotes a token writes on its line: (does it start a new line, the marks after its
    last newline in order: '"' for a straight one, '(' and ')' for curly opening and closing)."""

    def _read(self, piece: bytes) -> tuple[bool, str]:
        text = piece.decode("utf-8", "replace")
        line = text.rsplit("\n", 1)[-1]
        marks = "".join({'"': '"', "\u201c": "(", "\u201d": ")"}.get(ch, "") for ch in line)
        return "\n" in text, marks


class Numbers(_Pieces[tuple[str, int] | None]):
    """Tokens that write a whole number: (the spaces before it, its value), else None; and `token`,
    the one token that writes another number the same way, where the vocabulary has one."""

    def __init__(self, lm: LoadedModel) -> None:
        super().__init__(lm)
        self._tokens: dict[tuple[str, int], int | None] = {}

    def _read(self, piece: bytes) -> tuple[str, int] | None:
        text = piece.decode("utf-8", "replace")
        digits = text.lstrip(" ")
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 9):
            return None
        return text[:len(text) - len(digits)], int(digits)

    def token(self, lead: str, value: int) -> int | None:
        key = (lead, value)
        if key not in self._tokens:
            data = f"{lead}{value}".encode()
            buf = (llama_cpp.llama_token * 8)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
            # (a SentencePiece vocabulary may put a space token before it)
            same = [t for t in buf[:max(n, 0)] if token_piece(self.vocab, t, self._buf) == data]
            self._tokens[key] = same[0] if len(same) == 1 else None
        return self._tokens[key]


@dataclasses.dataclass(frozen=True)
class TokenText:
    """What prompt lookup reads from the vocabulary, each fact once per token: made once per loaded
    model (the worker keeps it beside the model), so later requests find it read."""

    ends_sentence: SentenceEnds
    quote_marks: QuoteMarks
    numbers: Numbers

    @classmethod
    def of(cls, lm: LoadedModel) -> TokenText:
        return cls(SentenceEnds(lm), QuoteMarks(lm), Numbers(lm))


def make_drafter(spec: SpeculationSettings, *, prompt: list[int], draft: DraftModel | None,
                 target: LoadedModel, max_tokens: int = 256, ngrams: NgramCache | None = None,
                 costs: dict[int, float] | None = None, text: TokenText | None = None) -> Drafter | None:
    """The drafter for one request, or None when speculation is off. `ngrams`: the conversation's
    n-gram cache held by the worker across requests (lookup drafts from earlier turns too).
    `costs`: verification cost by draft length, measured on this machine (engine/speculation/verify_cost.py).
    `text`: the target's TokenText, when the caller keeps one (else read afresh for this request)."""
    if spec.mode == "lookup":
        text = text or TokenText.of(target)
        return PromptLookup(ngram=spec.ngram, k_min=spec.k_min, k_max=spec.k_max, adaptive=spec.adaptive,
                            history=ngrams, costs=costs, ends_sentence=text.ends_sentence,
                            quote_marks=text.quote_marks, numbers=text.numbers)
    if spec.mode == "draft":
        if draft is None:
            raise KnownError("speculation mode 'draft' needs a loaded draft model")
        return DraftModelDrafter(draft, spec, prompt=prompt, max_tokens=max_tokens, target=target, costs=costs)
    return None

