"""A draft model: a second GGUF in the same process, with a KV sequence for each running request.

The draft's context has as many sequences as the target's (`n_parallel`), so requests that run
side by side each keep their own history in it and catch up only with their new tokens. The loop
verifies whatever is drafted (engine/batching/runner.py); here we only propose, and decide
(engine/speculation/adaptive.py) how much to propose, or whether to propose at all.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time

import llama_cpp
import numpy as np
from llama_cpp import _internals as internals

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SpeculationSettings
from ggufdesk.core.prompt_cache import common_prefix
from ggufdesk.engine.batching.runner import fill_batch
from ggufdesk.engine.runtime.native import LlamaLog, LoadedModel, load_model
from ggufdesk.engine.speculation.adaptive import DraftLength
from ggufdesk.engine.speculation.drafter import Controlled

log = logging.getLogger("ggufdesk.engine.speculation.speculative")

VOCAB_CHECK_START = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
VOCAB_MAX_SIZE_DIFF = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


def _text(vocab: llama_cpp.llama_vocab_p, i: int) -> bytes:
    return llama_cpp.llama_vocab_get_text(vocab, i) or b""


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """llama.cpp's rule for a draft: same tokenizer. Raises KnownError naming the first difference."""
    tv, dv = target.vocab, draft.vocab
    name = os.path.basename(draft.path)

    def refuse(what: str) -> KnownError:
        return KnownError(f"draft model {name} does not match the model: {what}")

    t_type, d_type = llama_cpp.llama_vocab_type(tv), llama_cpp.llama_vocab_type(dv)
    if t_type != d_type:
        raise refuse(f"vocab type {VOCAB_TYPES.get(d_type, d_type)} vs {VOCAB_TYPES.get(t_type, t_type)}")
    for what, fn in (("BOS token id", llama_cpp.llama_vocab_bos), ("EOS token id", llama_cpp.llama_vocab_eos),
                     ("add-BOS flag", llama_cpp.llama_vocab_get_add_bos),
                     ("add-EOS flag", llama_cpp.llama_vocab_get_add_eos)):
        a, b = fn(tv), fn(dv)
        if a != b:
            raise refuse(f"{what} {b} vs {a}")
    nt, nd = llama_cpp.llama_vocab_n_tokens(tv), llama_cpp.llama_vocab_n_tokens(dv)
    if abs(nt - nd) > VOCAB_MAX_SIZE_DIFF:
        raise refuse(f"vocab size {nd} vs {nt} (more than {VOCAB_MAX_SIZE_DIFF} apart)")
    for i in range(VOCAB_CHECK_START, min(nt, nd)):
        a, b = _text(tv, i), _text(dv, i)
        if a != b:
            raise refuse(f"token {i} is {b.decode('utf-8', 'replace')!r} vs "
                         f"{a.decode('utf-8', 'replace')!r}")


class DraftAborted(Exception):
    """A cancel stopped the draft model's decode (its sequence was rolled back)."""


class DraftModel:
    """The draft's context: sequence i holds `kv[i]`, the history of the request drafting there."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.path = lm.path
        n = max(1, lm.settings.n_parallel)
        self.kv: list[list[int]] = [[] for _ in range(n)]
        self.busy = [False] * n
        self._mem = llama_cpp.llama_get_memory(lm.ctx.ctx)
        self._batch = internals.LlamaBatch(n_tokens=max(lm.settings.n_batch, 1), embd=0, n_seq_max=1)
        self.memory_bytes = sum(v for key, v in lm.memory.items() if key != "gpu")
        self.prefill_tok_s: float | None = None  # measured while syncing
        self.alpha_hint: float | None = None  # acceptance seen in the last request
        self.plain_s: float | None = None  # the target's plain step, seen in the last request

    @classmethod
    def load(cls, spec: SpeculationSettings, *, target: LoadedModel, llama_log: LlamaLog) -> DraftModel:
        if not spec.draft_model:
            raise KnownError("no draft model given")
        ts = target.settings
        settings = dataclasses.replace(
            ts, n_ctx=spec.draft_ctx or target.n_ctx, n_gpu_layers=spec.draft_gpu_layers,
            n_threads=ts.threads, n_threads_batch=ts.threads_batch,
        )
        lm = load_model(spec.draft_model, settings, llama_log)
        try:
            check_compatible(target, lm)
        except KnownError:
            lm.close()
            raise
        lm.aborter.flag = target.aborter.flag  # one cancel stops both models (keep each callback alive)
        return cls(lm)

    def close(self) -> None:
        self.lm.close()

    # ---- sequences ----------------------------------------------------------------------------

    def acquire(self, history: list[int]) -> int:
        """A free sequence for a request, the one whose history shares most with `history`."""
        free = [i for i, b in enumerate(self.busy) if not b]
        if not free:
            raise KnownError("every draft sequence is in use")
        i = max(free, key=lambda j: common_prefix(self.kv[j], history))
        self.busy[i] = True
        return i

    def release(self, i: int) -> None:
        self.busy[i] = False

    def unsynced(self, history: list[int]) -> int:
        """Tokens of `history` a free sequence would still have to evaluate."""
        free = [kv for kv, b in zip(self.kv, self.busy) if not b] or self.kv
        return len(history) - max(common_prefix(kv, history) for kv in free)

    def sync(self, i: int, history: list[int]) -> float:
        """Make sequence i hold `history` (reusing the common prefix; the last token is always
        evaluated again, for its logits); returns seconds spent."""
        t = time.perf_counter()
        n = min(common_prefix(self.kv[i], history), len(history) - 1)
        self._truncate(i, n)
        todo = history[n:]
        step = max(1, self.lm.settings.n_batch)
        self.lm.abortable(len(todo) > 1)
        try:
            for j in range(0, len(todo), step):
                self._decode(i, todo[j:j + step])
        finally:
            self.lm.abortable(False)
        llama_cpp.llama_synchronize(self.lm.ctx.ctx)  # a GPU computes after llama_decode returns
        dt = time.perf_counter() - t
        if len(todo) >= 32:
            self.prefill_tok_s = len(todo) / max(dt, 1e-6)
        return dt

    def greedy(self, i: int, k: int, p_min: float, q_min: float = 0.0) -> list[int]:
        """Up to k greedy tokens after sequence i's history; stops when the top probability < p_min,
        or when the chance that the whole draft so far is accepted (the product of the draft's own
        top probabilities) falls below q_min: one more token would then cost more than it is worth."""
        out: list[int] = []
        q = 1.0
        while len(out) < k:
            row = self._logits()
            top = int(np.argmax(row))
            if p_min > 0 or q_min > 0:
                z = np.exp(row - row[top])
                p = 1.0 / float(z.sum())
                q *= p
                if p < p_min or (out and q < q_min):
                    break
            out.append(top)
            if len(out) < k:
                self._decode(i, [top])
        return out

    def _logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.lm.ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.lm.n_vocab,))

    def _truncate(self, i: int, n: int) -> None:
        if n < len(self.kv[i]):
            llama_cpp.llama_memory_seq_rm(self._mem, i, n, -1)
            del self.kv[i][n:]

    def _decode(self, i: int, tokens: list[int]) -> None:
        """Evaluate tokens at sequence i's next positions, logits for the last; when the cells run
        out, the other sequences' histories are dropped (they sync again when they next draft)."""
        n0 = len(self.kv[i])
        fill_batch(self._batch, [(t, n0 + j, i, j == len(tokens) - 1) for j, t in enumerate(tokens)])
        rc = llama_cpp.llama_decode(self.lm.ctx.ctx, self._batch.batch)
        if rc == 1:
            for j in range(len(self.kv)):
                if j != i:
                    self._truncate(j, 0)
            rc = llama_cpp.llama_decode(self.lm.ctx.ctx, self._batch.batch)
        if rc == 2:
            llama_cpp.llama_memory_seq_rm(self._mem, i, n0, -1)
            raise DraftAborted()
        if rc != 0:
            llama_cpp.llama_memory_seq_rm(self._mem, i, n0, -1)
            raise KnownError(f"the draft model's decode failed with code {rc}")
        self.kv[i].extend(tokens)


class DraftModelDrafter(Controlled):
    """Drafter over a DraftModel: lazy sync at the first proposal, so time to first token is untouched."""

    def __init__(self, dm: DraftModel, spec: SpeculationSettings, *, prompt: list[int], max_tokens: int,
                 target: LoadedModel, costs: dict[int, float] | None = None) -> None:
        self.dm = dm
        self.p_min = spec.p_min
        self.control = DraftLength(k_min=spec.k_min, k_max=spec.k_max, adaptive=spec.adaptive, label="draft",
                                   k_start=min(spec.k_max, 4), costs=costs)
        self.seq: int | None = None  # its sequence in the draft's context, from the first proposal
        self.setup_s = 0.0
        room = dm.lm.n_ctx - len(prompt) - 1
        if room < spec.k_max + 1:
            self.control.disable(f"the prompt ({len(prompt)} tokens) does not fit the draft's context "
                                 f"({dm.lm.n_ctx})")
        elif spec.adaptive:
            self._judge_prompt(prompt, max_tokens)

    def _judge_prompt(self, prompt: list[int], max_tokens: int) -> None:
        """Skip drafting when syncing a long prompt into the draft costs more than it can win back."""
        todo = self.dm.unsynced(prompt)
        rate = self.dm.prefill_tok_s
        if todo < 256 or rate is None:
            return
        cost = todo / rate
        # a plain step of a model ~this size, and the gain speculation brought last time (or a guess)
        alpha = self.dm.alpha_hint if self.dm.alpha_hint is not None else 0.6
        plain_s = self.dm.plain_s or 1.0 / 40.0
        gain = max_tokens * plain_s * max(0.0, 1.0 - 1.0 / (1.0 + alpha))
        if cost > gain:
            self.control.disable(f"long prompt: syncing {todo} tokens into the draft (~{cost:.1f} s) "
                                 f"costs more than it can gain (~{gain:.1f} s)")

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        seq = history + [last]
        self.setup_s = 0.0
        if len(seq) + k >= self.dm.lm.n_ctx:
            self.control.disable(f"the draft's context ({self.dm.lm.n_ctx}) is full")
            return []
        try:
            if self.seq is None:
                self.seq = self.dm.acquire(seq)
            self.setup_s = self.dm.sync(self.seq, seq)  # catching up with the prompt is paid once, not per step
            q_min = self.control.marginal() if self.control.adaptive else 0.0
            return self.dm.greedy(self.seq, k, self.p_min, q_min)
        except DraftAborted:
            return []
        except KnownError as e:
            self.control.disable(str(e))
            return []

    def feedback(self, n_drafted: int, n_accepted: int, cost: float, drafting: float = 0.0) -> None:
        self.control.feedback(n_drafted, n_accepted, cost, drafting if n_drafted == 0 else 0.0)
        if self.control.spec_steps:
            self.dm.alpha_hint = self.control.alpha()
        if self.control.unit_s is not None:
            self.dm.plain_s = self.control.unit_s

    def close(self) -> None:
        if self.seq is not None:
            self.dm.release(self.seq)
            self.seq = None
