"""A loaded model's vocabulary: text to tokens, tokens to bytes, end-of-generation tokens."""
from __future__ import annotations

import ctypes

import llama_cpp

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.runtime.native import LoadedModel, token_piece


class Vocab:
    """Tokenizing and token pieces of one loaded model (pieces are read once, then remembered)."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    def tokenize(self, text: str, *, add_bos: bool = True) -> list[int]:
        data = text.encode("utf-8")
        if not data:
            return [llama_cpp.llama_vocab_bos(self.lm.vocab)] if add_bos else []
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.lm.vocab, data, len(data), buf, n_max, add_bos, True)
        if n < 0:
            raise KnownError(f"could not tokenize the prompt (llama_tokenize returned {n})")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        p = self._pieces.get(token)
        if p is None:
            p = self._pieces[token] = token_piece(self.lm.vocab, token, self._piece_buf)
        return p

    def show_as_text(self, texts: tuple[str, ...] | list[str]) -> list[str]:
        """Make these special tokens (a format's markers: <think>, [TOOL_CALLS], harmony's channels)
        come out as their text, where llama.cpp renders control tokens as nothing; returns the ones
        changed."""
        shown = []
        for text in dict.fromkeys(texts):
            toks = self.tokenize(text, add_bos=False)
            if len(toks) == 1 and not self.piece(toks[0]):
                self._pieces[toks[0]] = text.encode("utf-8")
                shown.append(text)
        return shown

    def text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.lm.vocab, token))
