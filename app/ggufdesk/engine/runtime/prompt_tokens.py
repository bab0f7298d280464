"""A long chat prompt's tokens, piece by piece, each piece remembered: an agent's next turn tokenizes
only what is new.

Claude Code sends its system prompt, 25 tools and the whole conversation on every turn: 22,591 tokens on
SmolLM2, 35 ms to tokenize (80 ms with the Gemma starter's vocabulary), on the step loop's thread (every
other stream waits), although all but the last messages were tokenized the turn before
(bench/queue_stall.py).

Why the pieces add up to the whole: llama.cpp (llama-vocab.cpp, `tokenize`) first cuts the text at
every special token it finds (`tokenizer_st_partition`, longest tokens first, each occurrence from the
left) and then tokenizes each run of text between them on its own; a run's only tie to what came before
is SPM's leading space, given to a run that follows a special token or starts the text. So cutting the
text right before a special token M gives the same tokens as long as llama.cpp would also have made M a
token there. It would not where another special token T, searched for before M (T as long or longer),
overlaps M's place: T contains M, or starts with an end of M, or ends with a start of M. A marker that
any special token could overlap so is not cut at; nor one that strips the whitespace beside it
(LSTRIP/RSTRIP: the run before it would change), nor one with whitespace at an end.

The markers are the special tokens the chat template writes (`<|im_start|>`, `<start_of_turn>`): every
turn starts a piece. Only SPM and BPE vocabularies (whose runs are tokenized as above) and only where
tokenizing adds no EOS are cut; everything else, and every prompt under MIN_CHARS, is tokenized whole.
tests/engine/test_prompt_tokens.py compares pieces and whole on drawn chats (a tiny SPM, SmolLM2's BPE and Gemma's
SPM vocabularies) and on Claude Code's recorded turns.
"""
from __future__ import annotations

import array
import collections
import re
from typing import TYPE_CHECKING

import llama_cpp

if TYPE_CHECKING:
    from ggufdesk.engine.batching.vocab import Vocab

SPECIAL = (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
           | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN)  # llama.cpp's cache_special_tokens
STRIPS = llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP
# Under this many characters a prompt is tokenized whole: that takes under 5 ms here, and a one-shot
# prompt never pays for reading the vocabulary's special tokens (0.12 s on Gemma's 262k tokens, once).
MIN_CHARS = 8192
CACHE_CHARS = 1 << 22  # pieces remembered, in characters: several agents' prompts (about 16 MB)


def _overlaps(m: bytes, t: bytes) -> bool:
    """Could an occurrence of t cover part of an occurrence of m (t != m)? (llama.cpp matches bytes)"""
    return m in t or any(t.startswith(m[k:]) or t.endswith(m[:k]) for k in range(1, len(m)))


def safe_markers(written: set[bytes], specials: dict[bytes, int]) -> list[str]:
    """The special tokens the template writes (`written`) that a prompt may be cut before, given every
    special token's text and attributes."""
    out = []
    for m in written:
        attr = specials.get(m, 0)
        if len(m) < 2 or m != m.strip() or attr & STRIPS or not attr & SPECIAL:
            continue
        if any(t != m and len(t) >= len(m) and _overlaps(m, t) for t in specials):
            continue
        try:
            out.append(m.decode("utf-8"))
        except UnicodeDecodeError:  # (not text a template could write)
            continue
    return sorted(out)


class PromptTokens:
    """One loaded model's chat prompts to tokens (`tokenize` is `vocab.tokenize`'s equal)."""

    def __init__(self, vocab: Vocab, template_source: str | None) -> None:
        self._vocab = vocab
        self._source = template_source or ""
        self._cut: re.Pattern[str] | None = None  # finds the markers (None: this model's prompts are not cut)
        self._decided = False  # (the vocabulary is read at the first long prompt)
        self._pieces: collections.OrderedDict[tuple[str, bool], array.array[int]] = collections.OrderedDict()
        self._chars = 0

    def tokenize(self, text: str, *, add_bos: bool) -> list[int]:
        cut = self._cutter() if len(text) >= MIN_CHARS else None
        if cut is None:
            return self._vocab.tokenize(text, add_bos=add_bos)
        starts = [0] + [m.start() for m in cut.finditer(text) if m.start() > 0] + [len(text)]
        out: list[int] = []
        for i in range(len(starts) - 1):
            out += self._piece(text[starts[i]:starts[i + 1]], add_bos and i == 0)
        return out

    def _piece(self, text: str, add_bos: bool) -> array.array[int]:
        key = (text, add_bos)
        hit = self._pieces.get(key)
        if hit is not None:
            self._pieces.move_to_end(key)
            return hit
        toks = self._pieces[key] = array.array("i", self._vocab.tokenize(text, add_bos=add_bos))
        self._chars += len(text)
        while self._chars > CACHE_CHARS and len(self._pieces) > 1:
            (old, _), _ = self._pieces.popitem(last=False)
            self._chars -= len(old)
        return toks

    def _cutter(self) -> re.Pattern[str] | None:
        if not self._decided:
            markers = self._markers()
            if markers:
                self._cut = re.compile("|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)))
            self._decided = True
        return self._cut

    def _markers(self) -> list[str]:
        lm = self._vocab.lm
        v = lm.vocab
        if llama_cpp.llama_vocab_type(v) not in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE) \
                or llama_cpp.llama_vocab_get_add_eos(v):
            return []
        # the special tokens the template's text holds: tokenizing it finds them (a transcript template
        # for a base model holds none, and the vocabulary is not read at all)
        written = {lm.token_text(t) for t in self._vocab.tokenize(self._source, add_bos=False)
                   if llama_cpp.llama_vocab_get_attr(v, t) & SPECIAL}
        if not written:
            return []
        specials: dict[bytes, int] = {}
        for tok in range(llama_cpp.llama_vocab_n_tokens(v)):
            attr = llama_cpp.llama_vocab_get_attr(v, tok)
            if attr & SPECIAL:
                text = lm.token_text(tok)
                specials[text] = specials.get(text, 0) | attr
        return safe_markers(written, specials)
