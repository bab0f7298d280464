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
from ggufdesk.engine.speculation import hints
from ggufdesk.engine.speculation.draft_model import DraftModel, DraftModelDrafter
from ggufdesk.engine.speculation.drafter import Drafter
from ggufdesk.engine.speculation.lookup import NgramCache, PromptLookup

Fact = TypeVar("Fact")
# numbers whose tokens Numbers.write keeps: a list's next few at a time are what is asked again, and
# a server that counts on distinct numbers for weeks must not grow without bound
WRITTEN_KEPT = 4096


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
    """Does a token end a sentence or a line (engine/speculation/hints.py: ends_sentence)?"""

    def _read(self, piece: bytes) -> bool:
        return hints.ends_sentence(piece.decode("utf-8", "replace"))


class QuoteMarks(_Pieces[tuple[bool, str]]):
    """The quote marks a token writes on its line: (does it start a new line, the marks after its
    last newline in order; engine/speculation/hints.py: quote_marks)."""

    def _read(self, piece: bytes) -> tuple[bool, str]:
        return hints.quote_marks(piece.decode("utf-8", "replace"))


class Numbers(_Pieces[tuple[str, str] | None]):
    """Tokens that write digits, in any digit script: (their lead, the digits in ASCII), else None
    (engine/speculation/hints.py: number); and `write`, the tokens that write another number the same
    way, as this vocabulary's tokenizer writes it (a digit per token in most vocabularies of 2026)."""

    def __init__(self, lm: LoadedModel) -> None:
        super().__init__(lm)
        self._written: dict[tuple[str, str], list[int] | None] = {}

    def _read(self, piece: bytes) -> tuple[str, str] | None:
        return hints.number(piece.decode("utf-8", "replace"))

    def write(self, lead: str, digits: str) -> list[int] | None:
        key = (lead, digits)
        if key not in self._written:
            if len(self._written) >= WRITTEN_KEPT:  # the worker keeps this reader for the model's life
                self._written.clear()
            data = hints.write_number(lead, digits).encode()
            buf = (llama_cpp.llama_token * (2 * hints.MAX_DIGITS + 4))()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
            tokens = list(buf[:max(n, 0)])
            pieces = [token_piece(self.vocab, t, self._buf) for t in tokens]
            if pieces and not pieces[0].strip() and not data.startswith(pieces[0]):
                tokens, pieces = tokens[1:], pieces[1:]  # a SentencePiece vocabulary's space in front
            # only tokens that write exactly this text, each one digits (with the lead's spaces first)
            exact = b"".join(pieces) == data and all(self(t) is not None for t in tokens)
            self._written[key] = tokens if tokens and exact else None
        return self._written[key]


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
        on = hints.active(spec.lookup_hints_off)  # a hint switched off: lookup goes without that reader
        return PromptLookup(ngram=spec.ngram, k_min=spec.k_min, k_max=spec.k_max, adaptive=spec.adaptive,
                            history=ngrams, costs=costs,
                            ends_sentence=text.ends_sentence if "sentence_ends" in on else None,
                            quote_marks=text.quote_marks if "quotes" in on else None,
                            numbers=text.numbers if "counts" in on else None)
    if spec.mode == "draft":
        if draft is None:
            raise KnownError("speculation mode 'draft' needs a loaded draft model")
        return DraftModelDrafter(draft, spec, prompt=prompt, max_tokens=max_tokens, target=target, costs=costs)
    return None

