"""Embeddings: an embedding context beside the loaded model's, one input at a time, pooled and L2-normalised.

The generation context is left alone (its KV cells belong to the step loop): embeddings get a
second llama.cpp context on the same weights with `embeddings=true` and the model's own pooling
(its GGUF `<arch>.pooling_type`; a chat model, which has none, is mean-pooled, as Ollama and
llama-server do). Each input is decoded alone in a cleared cache, so an input's vector is the same
whether it came alone or in a batch, and the same on every call.
"""
from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals

from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import EMBEDDING_ARCHS, embedding_only
from ggufdesk.engine.runtime.llama_typed import close
from ggufdesk.engine.runtime.native import FLASH_ATTN_IDS, LlamaLog, LoadedModel
from ggufdesk.engine.runtime.tokens import refusal, tokenize

log = logging.getLogger("ggufdesk.engine")

MAX_EMBED_INPUTS = 4096  # inputs in one Embed request
MAX_EMBED_TOKENS = 4096  # one input's limit (and the embedding context's size); less if the model's context is
CHUNK = 64  # tokens per decode for a causal model: its logits (n_vocab floats each) are computed too
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class EmbedCancelled(Exception):
    """The request was cancelled while its input was being decoded."""


def model_pooling(lm: LoadedModel) -> int:
    """The pooling the model declares in its metadata (-1 when it declares none)."""
    raw = lm.metadata.get(f"{lm.arch}.pooling_type")
    try:
        return int(raw) if raw not in (None, "") else -1
    except ValueError:
        return -1


def is_causal(lm: LoadedModel) -> bool:
    """Does the model attend causally (a chat model), or to the whole input at once (an encoder)?"""
    flag = str(lm.metadata.get(f"{lm.arch}.attention.causal", "")).lower()
    return lm.arch not in EMBEDDING_ARCHS and flag not in ("false", "0")


def is_embedding_model(lm: LoadedModel) -> bool:
    """A model that only computes embeddings (an encoder, or one that declares its pooling)."""
    return embedding_only(lm.arch, model_pooling(lm))


@dataclass
class Vector:
    values: list[float]
    n_tokens: int  # tokens the input was decoded as (after truncation)
    truncated: bool
    n_decode: int = 0  # llama_decode calls it took


class Embedder:
    """An embedding context on a loaded model. Not thread-safe (the engine's main thread uses it).

    An encoder (BERT and kin: non-causal attention) must see the whole input in one micro-batch, and
    llama.cpp pools it. A causal (chat) model reads the input in chunks of CHUNK tokens through its
    KV cache and we pool the per-token states ourselves: llama.cpp would otherwise compute the LM
    head for every input token at once (for a 262k vocabulary, 1 GiB of logits per 1k tokens).
    """

    def __init__(self, lm: LoadedModel, llama_log: LlamaLog) -> None:
        declared = model_pooling(lm)
        if declared == 4:
            raise KnownError(f"{lm.arch} model {lm.path.rsplit('/', 1)[-1]} is a reranker (rank pooling): "
                             "it scores pairs, it does not compute embeddings")
        self.pooling = declared if declared in (1, 2, 3) else 1  # none or undeclared: mean
        self.lm = lm
        self.causal = is_causal(lm)
        train = lm.model.n_ctx_train() or MAX_EMBED_TOKENS
        self.n_max = max(8, min(MAX_EMBED_TOKENS, train, lm.settings.n_ctx))
        self.n_embd = llama_cpp.llama_model_n_embd_out(lm.model.model) or llama_cpp.llama_model_n_embd(lm.model.model)
        step = CHUNK if self.causal else self.n_max  # an encoder's input must fit one micro-batch
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = self.n_max
        p.n_batch = p.n_ubatch = p.n_outputs_max = step
        p.n_seq_max = 1
        p.n_threads = lm.settings.threads
        p.n_threads_batch = lm.settings.threads_batch
        p.flash_attn_type = FLASH_ATTN_IDS[lm.settings.flash_attn]
        p.embeddings = True
        p.pooling_type = 0 if self.causal else self.pooling  # causal: per-token states, pooled here
        mark = llama_log.mark()
        try:
            self.ctx = internals.LlamaContext(model=lm.model, params=p, verbose=True)
        except ValueError:
            why = llama_log.reason(llama_log.since(mark)) or "unknown reason"
            raise KnownError(f"llama.cpp could not create an embedding context: {why}") from None
        self.step = step
        self._batch = internals.LlamaBatch(n_tokens=step, embd=0, n_seq_max=1)
        self._mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        self.n_decode = 0  # llama_decode calls so far

    @property
    def pooling_name(self) -> str:
        return POOLING_NAMES[self.pooling]

    def tokenize(self, text: str) -> list[int]:
        """The input as the model reads it for an embedding: with its BOS/CLS (and SEP/EOS if it adds one)."""
        return tokenize(self.lm, text, add_special=True, parse_special=False)

    def embed(self, item: str | Sequence[int], *, truncate: bool, aborter: object | None = None) -> Vector:
        """One input (text, or token ids) as a unit-length vector. Raises KnownError (kind "context"
        when it is too long and truncate is off) or EmbedCancelled."""
        tokens = self.tokenize(item) if isinstance(item, str) else list(item)
        if not tokens:
            raise refusal("an input is empty (this model adds no start token to embed it with)", "settings")
        n_vocab = self.lm.n_vocab
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_vocab for t in tokens):
            raise refusal(f"an input's token ids must be whole numbers from 0 to {n_vocab - 1}", "settings")
        cut = len(tokens) > self.n_max
        if cut and not truncate:
            raise refusal(f"an input is {len(tokens)} tokens; this model embeds at most {self.n_max} "
                          "at a time (shorten it, or ask for truncation)", "context")
        tokens = tokens[:self.n_max]
        llama_cpp.llama_memory_clear(self._mem, True)
        n_decode = self.n_decode
        callback = getattr(aborter, "_callback", None)
        if callback is not None:
            llama_cpp.llama_set_abort_callback(self.ctx.ctx, callback, ctypes.c_void_p(0))
        try:
            pooled = self._causal(tokens) if self.causal else self._encoder(tokens)
        finally:
            if callback is not None:
                no_callback = ctypes.cast(ctypes.c_void_p(), llama_cpp.ggml_abort_callback)  # a NULL function pointer
                llama_cpp.llama_set_abort_callback(self.ctx.ctx, no_callback, ctypes.c_void_p(0))
        return Vector(values=normalise(pooled), n_tokens=len(tokens), truncated=cut, n_decode=self.n_decode - n_decode)

    def _decode(self, tokens: list[int], pos0: int) -> None:
        b = self._batch.batch
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = True  # embeddings need every token's output
        b.n_tokens = len(tokens)
        rc = llama_cpp.llama_decode(self.ctx.ctx, b)
        if rc == 2:
            raise EmbedCancelled()
        if rc != 0:
            raise KnownError(f"llama_decode failed with code {rc} while computing an embedding")
        self.n_decode += 1

    def _row(self, ptr: object) -> np.ndarray:
        if not ptr:
            raise KnownError("llama.cpp returned no embedding for the input")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float64)

    def _encoder(self, tokens: list[int]) -> np.ndarray:
        self._decode(tokens, 0)
        return self._row(llama_cpp.llama_get_embeddings_seq(self.ctx.ctx, 0))

    def _causal(self, tokens: list[int]) -> np.ndarray:
        """Mean (or last, or first: CLS) of the final hidden states, read CHUNK tokens at a time."""
        total = np.zeros(self.n_embd, np.float64)
        first: np.ndarray | None = None
        for i in range(0, len(tokens), self.step):
            chunk = tokens[i:i + self.step]
            self._decode(chunk, i)
            if self.pooling == 1:
                for j in range(len(chunk)):
                    total += self._row(llama_cpp.llama_get_embeddings_ith(self.ctx.ctx, j))
            elif first is None:
                first = self._row(llama_cpp.llama_get_embeddings_ith(self.ctx.ctx, 0))
        if self.pooling == 1:
            return total / len(tokens)
        if self.pooling == 2:
            assert first is not None
            return first
        return self._row(llama_cpp.llama_get_embeddings_ith(self.ctx.ctx, -1))

    def close(self) -> None:
        close(self.ctx)
        close(self._batch)


def check_inputs(inputs: object) -> None:
    """An Embed request's inputs: 1 to MAX_EMBED_INPUTS texts or token id lists (else a settings error)."""
    if not isinstance(inputs, list) or not inputs:
        raise refusal("embeddings need at least one input", "settings")
    if len(inputs) > MAX_EMBED_INPUTS:
        raise refusal(f"at most {MAX_EMBED_INPUTS} inputs at a time, got {len(inputs)}", "settings")
    for x in inputs:
        if not isinstance(x, str) and not (isinstance(x, list) and all(isinstance(t, int) for t in x)):
            raise refusal("each input must be a text or a list of token ids", "settings")


def normalise(values: np.ndarray) -> list[float]:
    """L2 normalisation (a zero vector stays zero)."""
    norm = float(np.sqrt(np.dot(values, values)))
    return (values / norm).tolist() if norm > 0 else [0.0] * len(values)
