"""Tokenize and detokenize for the Tokenize request (llama-server's /tokenize and /detokenize, count_tokens)."""
from __future__ import annotations

import ctypes
from typing import Any, Iterable

import llama_cpp

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.native import LoadedModel, token_piece

MAX_BIAS_TEXT = 4096  # characters in one logit_bias text key


def refusal(message: str, kind: P.ErrorKind) -> P.EngineRequestError:
    """A refusal with the protocol ErrorKind the engine reports it as ("settings": 400, "context": 400)."""
    return P.EngineRequestError(kind, message)


def tokenize(lm: LoadedModel, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    n_max = len(data) + 8
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(lm.vocab, data, len(data), buf, n_max, add_special, parse_special)
    if n < 0:
        raise KnownError(f"could not tokenize the text (llama_tokenize returned {n})")
    return list(buf[:n])


def check_ids(vocab: Any, tokens: Any) -> list[int]:
    """Token ids the loaded model has (a settings error otherwise, or for none at all)."""
    n_vocab = vocab.lm.n_vocab
    if not isinstance(tokens, list) or not tokens or any(
            isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab for t in tokens):
        raise refusal(f"token ids must be a non-empty list of whole numbers from 0 to {n_vocab - 1}", "settings")
    return tokens


def detokenize(vocab: Any, tokens: list[int]) -> str:
    """The text of token ids, special tokens as their text ("<s> Hi"), as llama-server's /detokenize gives it."""
    if tokens:
        check_ids(vocab, tokens)
    buf = ctypes.create_string_buffer(64)
    return b"".join(token_piece(vocab.lm.vocab, t, buf, special=True) for t in tokens).decode("utf-8", "replace")


def pieces(vocab: Any, tokens: list[int]) -> list[str | list[int]]:
    """Each token's text (special tokens as their text); a piece that is not valid UTF-8 on its own is
    given as its bytes."""
    if tokens:
        check_ids(vocab, tokens)
    out: list[str | list[int]] = []
    buf = ctypes.create_string_buffer(64)
    for t in tokens:
        raw = token_piece(vocab.lm.vocab, t, buf, special=True)
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(list(raw))
    return out


def logit_bias(pairs: Iterable[tuple[Any, Any]], never: list[int], n_vocab: int) -> tuple[Any, Any]:
    """(ids, values) to add to a logits row: `pairs` are (token id, as text or a number; a number, or
    None for never), added up when a token comes more than once; `never` are token ids never to sample.
    A bad id or value is a settings error."""
    import numpy as np

    merged: dict[int, float] = {t: -np.inf for t in never}
    for key, value in pairs:
        try:
            t = int(key)
        except (TypeError, ValueError):
            raise refusal(f"logit_bias keys must be token ids, got {str(key)[:20]!r}", "settings") from None
        if not 0 <= t < n_vocab:
            raise refusal(f"logit_bias: token id {t} is not in the vocabulary (0-{n_vocab - 1})", "settings")
        if value is None:
            merged[t] = -np.inf
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not -1e6 <= value <= 1e6:
            raise refusal(f"logit_bias: the bias of token {t} must be a number or null", "settings")
        else:
            merged[t] = merged.get(t, 0.0) + float(value)
    ids = np.fromiter(merged.keys(), dtype=np.int64, count=len(merged))
    return ids, np.fromiter(merged.values(), dtype=np.float32, count=len(merged))


def text_bias(lm: LoadedModel, entries: list[list[Any]]) -> list[tuple[int, Any]]:
    """llama-server's text keys: each [text, bias] as (token, bias) for every token of the text
    (tokenized as llama.cpp does for them: no BOS, special-token text read as text)."""
    out: list[tuple[int, Any]] = []
    for entry in entries:
        if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str):
            raise refusal("logit_bias: a text key must come as [text, bias]", "settings")
        if len(entry[0]) > MAX_BIAS_TEXT:
            raise refusal(f"logit_bias: a text key is longer than {MAX_BIAS_TEXT} characters", "settings")
        out += [(t, entry[1]) for t in tokenize(lm, entry[0], add_special=False, parse_special=False)]
    return out


def applied_bias(bias: tuple[Any, Any] | None) -> list[list[Any]]:
    """A sequence's bias arrays as [token id, bias or None for never] (Done.logit_bias)."""
    if bias is None:
        return []
    import math

    return [[int(t), None if math.isinf(v) else float(v)] for t, v in zip(bias[0].tolist(), bias[1].tolist())]
