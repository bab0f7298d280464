"""Sampling from a step's logits rows: llama.cpp's sampler chain, greedy argmax, grammar, logprobs."""
from __future__ import annotations

import math
import os
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals

from ggufdesk.core.settings import SamplingSettings
from ggufdesk.engine.batching.sequence import Sequence
from ggufdesk.engine.batching.vocab import Vocab
from ggufdesk.engine.runtime.llama_typed import add_greedy, new_sampler
from ggufdesk.engine.runtime.native import LoadedModel


def make_sampler(lm: LoadedModel, s: SamplingSettings) -> internals.LlamaSampler | None:
    """llama.cpp's sampler chain, in llama-cpp-python's order; None means plain greedy (argmax)."""
    if s.temperature == 0 and s.repeat_penalty == 1.0:
        return None
    smp = new_sampler()
    if s.repeat_penalty != 1.0:
        smp.add_penalties(lm.n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0)
    if s.temperature == 0:
        add_greedy(smp)
        return smp
    seed = s.seed if s.seed >= 0 else int.from_bytes(os.urandom(4), "little")
    smp.add_top_k(s.top_k)
    smp.add_top_p(s.top_p, 1)
    smp.add_min_p(s.min_p, 1)
    smp.add_temp(s.temperature)
    smp.add_dist(seed)
    return smp


def llama_perf(lm: LoadedModel) -> dict[str, Any]:
    """llama.cpp's per-context timings since the last reset. Note: every batch of more than one
    token counts as prompt eval (p_eval) there, speculative verification included."""
    d = llama_cpp.llama_perf_context(lm.ctx.ctx)
    return {"prompt_ms": round(d.t_p_eval_ms, 3), "prompt_tokens": d.n_p_eval,
            "eval_ms": round(d.t_eval_ms, 3), "eval_tokens": d.n_eval,
            "prompt_tok_s": round(1000 * d.n_p_eval / d.t_p_eval_ms, 2) if d.t_p_eval_ms > 0 else 0.0,
            "eval_tok_s": round(1000 * d.n_eval / d.t_eval_ms, 2) if d.t_eval_ms > 0 else 0.0}


class Sampling:
    """Samples a sequence's next token from a row of the last decode call's logits."""

    def __init__(self, lm: LoadedModel, vocab: Vocab) -> None:
        self.lm, self.vocab = lm, vocab

    def logits_row(self, row: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.lm.ctx.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.lm.n_vocab,))

    def sample(self, s: Sequence, row: int) -> tuple[int, dict[str, Any] | None]:
        """(token, its logprob entry when the request asked for them). Every call is one draw of
        the sequence's sampler: verification calls it once per emitted token, as plain decoding does.
        A reasoning budget that ran out writes the tokens that close the block instead, one a call."""
        free = s.constraint is None or s.constraint.awaiting  # an active grammar decides every token
        forced = s.reasoning.forced() if s.reasoning is not None and free else None
        if forced is not None:  # (the planner keeps drafts within the budget: DraftPlanner._room)
            if s.constraint is not None:
                s.constraint.accept(forced)
            return forced, None
        if s.bias is not None:  # the row is llama.cpp's own logits buffer: its sampler reads the biased values
            self.logits_row(row)[s.bias[0]] += s.bias[1]
        if s.constraint is not None:  # engine/structured/grammar.py: check the sampled token, resample if rejected
            t = s.constraint.sample(self.logits_row(row), s.sampler)
        elif s.sampler is None:
            t = int(np.argmax(self.logits_row(row)))
        else:
            t = llama_cpp.llama_sampler_sample(s.sampler.sampler, self.lm.ctx.ctx, row)
        return t, (self._logprob_entry(row, t, s.logprobs) if s.logprobs else None)

    def accept(self, s: Sequence, token: int) -> None:
        """A token written without sampling (forced): the sampler's history and the grammar see it."""
        if s.sampler is not None:
            llama_cpp.llama_sampler_accept(s.sampler.sampler, token)
        if s.constraint is not None:
            s.constraint.accept(token)

    def _logprob_entry(self, row: int, token: int, n: int) -> dict[str, Any]:
        logits = self.logits_row(row)
        m = float(logits.max())
        lse = m + math.log(float(np.exp(logits - m, dtype=np.float64).sum()))
        n = min(n, len(logits))
        top = np.argpartition(-logits, n - 1)[:n]
        top = top[np.argsort(-logits[top], kind="stable")]
        text = self.vocab.text
        return {"token": text(token), "logprob": float(logits[token]) - lse, "id": int(token),
                "top": [{"token": text(int(i)), "logprob": float(logits[i]) - lse, "id": int(i)} for i in top]}
