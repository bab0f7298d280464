"""Our decode loop on llama.cpp's low-level API: prefix reuse, chunked prefill, sampling, verification.

Why our own (docs/architecture.md, "The decode loop"): llama-cpp-python's high-level speculative
path forces logits_all, which costs gigabytes and makes prefill 3x slower. Here logits are requested
only where we sample, and plain decoding is verification of an empty draft, so both paths share one
code.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.runtime.native import LoadedModel, token_piece
from ggufdesk.engine.batching.text import TextStream

log = logging.getLogger("ggufdesk.engine")


class Cancelled(Exception):
    """The request was cancelled (abort callback or between steps)."""


class Drafter(Protocol):
    """Proposes tokens that the target model then verifies (engine/speculation/speculative.py).

    The loop asks `k` (0 = do not speculate this step), calls `propose`, verifies, then reports
    back through `feedback` with the wall time of the whole step (propose + verify), also for
    plain steps (n_drafted = 0), so a drafter can compare and adapt K or switch itself off.
    """

    k: int  # the draft length it wants now
    status: str  # for stats: "draft", "lookup", "disabled: <why>"

    def propose(self, history: list[int], last: int, k: int) -> list[int]: ...

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float) -> None: ...


@dataclass
class RunStats:
    n_prompt: int = 0
    n_reused: int = 0
    n_gen: int = 0
    t_start: float = 0.0
    t_prefill_end: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    drafted: int = 0
    accepted: int = 0
    draft_len: int = 0
    speculation: str = "off"
    tokens: list[int] = field(default_factory=list)
    perf: dict = field(default_factory=dict)  # llama.cpp's own timings of this request

    @property
    def ttft_s(self) -> float:
        return max(0.0, self.t_first - self.t_start) if self.t_first else 0.0

    @property
    def prefill_tok_s(self) -> float:
        n = self.n_prompt - self.n_reused
        dt = self.t_prefill_end - self.t_start
        return n / dt if n > 0 and dt > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        dt = self.t_last - self.t_first
        return (self.n_gen - 1) / dt if self.n_gen > 1 and dt > 0 else 0.0


def llama_perf(lm: LoadedModel) -> dict:
    """llama.cpp's per-context timings since the last reset. Note: every batch of more than one
    token counts as prompt eval (p_eval) there, speculative verification included."""
    d = llama_cpp.llama_perf_context(lm.ctx.ctx)
    return {"prompt_ms": round(d.t_p_eval_ms, 3), "prompt_tokens": d.n_p_eval,
            "eval_ms": round(d.t_eval_ms, 3), "eval_tokens": d.n_eval,
            "prompt_tok_s": round(1000 * d.n_p_eval / d.t_p_eval_ms, 2) if d.t_p_eval_ms > 0 else 0.0,
            "eval_tok_s": round(1000 * d.n_eval / d.t_eval_ms, 2) if d.t_eval_ms > 0 else 0.0}


def make_sampler(lm: LoadedModel, s: SamplingSettings) -> internals.LlamaSampler | None:
    """llama.cpp's sampler chain, in llama-cpp-python's order; None means plain greedy (argmax)."""
    if s.temperature == 0 and s.repeat_penalty == 1.0:
        return None
    smp = internals.LlamaSampler()
    if s.repeat_penalty != 1.0:
        smp.add_penalties(lm.n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0)
    if s.temperature == 0:
        smp.add_greedy()
        return smp
    seed = s.seed if s.seed >= 0 else int.from_bytes(os.urandom(4), "little")
    smp.add_top_k(s.top_k)
    smp.add_top_p(s.top_p, 1)
    smp.add_min_p(s.min_p, 1)
    smp.add_temp(s.temperature)
    smp.add_dist(seed)
    return smp


class Generator:
    """Owns one model's KV cache (sequence 0) and runs requests on it, one at a time."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        self.n_batch = lm.settings.n_batch
        self._batch = internals.LlamaBatch(n_tokens=max(self.n_batch, 65), embd=0, n_seq_max=1)
        self._mem = llama_cpp.llama_get_memory(lm.ctx.ctx)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    # ---- tokens and text ----------------------------------------------------------------------

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

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.lm.vocab, token))

    # ---- KV cache -----------------------------------------------------------------------------

    def truncate(self, n: int) -> None:
        """Keep only the first n positions in the KV cache."""
        if n >= len(self.tokens):
            return
        if not llama_cpp.llama_memory_seq_rm(self._mem, 0, n, -1):
            llama_cpp.llama_memory_clear(self._mem, True)
            self.tokens = []
            return
        del self.tokens[n:]

    def reuse_prefix(self, prompt: list[int]) -> int:
        """Drop the cache past the longest common prefix with `prompt`; returns tokens kept."""
        n = 0
        for a, b in zip(self.tokens, prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1)  # the last prompt token is always evaluated: we need its logits
        self.truncate(n)
        return len(self.tokens)

    def _decode(self, tokens: list[int], *, logits: str) -> None:
        """Evaluate tokens at the next positions. logits: 'last' or 'all'."""
        b = self._batch.batch
        n0 = len(self.tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = n0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = logits == "all"
        b.logits[len(tokens) - 1] = True
        b.n_tokens = len(tokens)
        rc = llama_cpp.llama_decode(self.lm.ctx.ctx, b)
        if rc == 2:
            self.truncate(n0)  # whatever part of the aborted batch landed is dropped
            llama_cpp.llama_memory_seq_rm(self._mem, 0, n0, -1)
            raise Cancelled()
        if rc == 1:
            raise KnownError(f"the context is full ({self.lm.n_ctx} tokens); start a new conversation "
                             "or load the model with a larger context")
        if rc != 0:
            raise KnownError(f"llama_decode failed with code {rc}")
        self.tokens.extend(tokens)

    def prefill(self, tokens: list[int], on_progress: Callable[[int, int], None] | None = None) -> None:
        """Evaluate the prompt in n_batch chunks, logits only for its last token; abortable."""
        total = len(tokens)
        self.lm.abortable(True)
        try:
            for i in range(0, total, self.n_batch):
                self._decode(tokens[i: i + self.n_batch], logits="last")
                if on_progress:
                    on_progress(min(i + self.n_batch, total), total)
        finally:
            self.lm.abortable(False)

    def logits_row(self, idx: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.lm.ctx.ctx, idx)
        return np.ctypeslib.as_array(ptr, shape=(self.lm.n_vocab,))

    def sample(self, sampler: internals.LlamaSampler | None, idx: int) -> int:
        if sampler is None:
            return int(np.argmax(self.logits_row(idx)))
        return llama_cpp.llama_sampler_sample(sampler.sampler, self.lm.ctx.ctx, idx)

    def verify(self, sampler: internals.LlamaSampler | None, last: int, draft: list[int]) -> list[int]:
        """Evaluate [last] + draft in one batch and sample-and-match (docs/architecture.md, "The decode loop").

        Returns the emitted tokens: the accepted draft prefix plus one target sample (the
        correction at the first mismatch, or the bonus token when all matched). Every emitted
        token is a target sample, so the output is exactly what plain decoding would give.
        """
        n0 = len(self.tokens)
        self._decode([last] + draft, logits="all" if draft else "last")
        out: list[int] = []
        for i in range(len(draft) + 1):
            t = self.sample(sampler, i if draft else -1)
            out.append(t)
            if i == len(draft) or t != draft[i]:
                break
        # the cache holds last + draft; keep last + the accepted part of the draft
        self.truncate(n0 + len(out))
        return out

    # ---- one request --------------------------------------------------------------------------

    def run(
        self,
        prompt: list[int],
        sampling: SamplingSettings,
        *,
        emit_text: Callable[[str], None],
        on_progress: Callable[[int, int], None] | None = None,
        on_stats: Callable[[RunStats], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        drafter: Drafter | None = None,
        t_start: float | None = None,
    ) -> tuple[str, RunStats]:
        """Generate for `prompt`; returns (finish_reason, stats). Raises Cancelled."""
        if self.lm.ctx.ctx is None:
            raise KnownError("the model was unloaded")
        st = RunStats(n_prompt=len(prompt), t_start=t_start or time.perf_counter())
        n_ctx = self.lm.n_ctx
        if len(prompt) >= n_ctx:
            raise KnownError(f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}")
        st.n_reused = self.reuse_prefix(prompt)
        llama_cpp.llama_perf_context_reset(self.lm.ctx.ctx)
        sampler = make_sampler(self.lm, sampling)
        stream = TextStream(sampling.stop)
        self.prefill(prompt[st.n_reused:], on_progress)
        st.t_prefill_end = time.perf_counter()
        if sampler is not None and sampling.repeat_penalty != 1.0:
            for t in prompt[-max(sampling.repeat_last_n, 0):] if sampling.repeat_last_n else []:
                sampler.accept(t)
        last = self.sample(sampler, -1)
        pending = [last]
        finish = ""
        next_stats = 0.0
        try:
            while True:
                for t in pending:
                    if self.is_eog(t):
                        finish = "stop"
                        break
                    st.n_gen += 1
                    st.tokens.append(t)
                    now = time.perf_counter()
                    st.t_first = st.t_first or now
                    st.t_last = now
                    text = stream.push(self.piece(t))
                    if text:
                        emit_text(text)
                    if stream.stopped:
                        finish = "stop"
                        break
                    if st.n_gen >= sampling.max_tokens:
                        finish = "length"
                        break
                if finish:
                    break
                if cancelled():
                    raise Cancelled()
                if on_stats and st.t_last >= next_stats:
                    on_stats(st)
                    next_stats = st.t_last + 0.25
                last = pending[-1]
                room = n_ctx - len(self.tokens) - 1
                if room <= 0:
                    finish = "length"
                    break
                draft: list[int] = []
                t_step = time.perf_counter()
                if drafter is not None:
                    k = min(drafter.k, room - 1, sampling.max_tokens - st.n_gen - 1, self.lm.n_outputs - 1)
                    if k > 0:
                        draft = drafter.propose(self.tokens, last, k)[:k]
                pending = self.verify(sampler, last, draft)
                if drafter is not None:
                    n_acc = len(pending) - 1 if draft else 0
                    st.drafted += len(draft)
                    st.accepted += n_acc
                    drafter.feedback(len(draft), n_acc, time.perf_counter() - t_step)
                    st.draft_len, st.speculation = drafter.k, drafter.status
        finally:
            if sampler is not None:
                sampler.close()
        tail = stream.flush()
        if tail:
            emit_text(tail)
        st.perf = llama_perf(self.lm)
        return finish, st
