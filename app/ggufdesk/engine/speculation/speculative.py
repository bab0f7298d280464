"""Drafters for speculative decoding: a draft model in the same process, or prompt lookup (speculation/lookup.py).

The loop in engine/batching/generate.py verifies whatever a drafter proposes; here we only propose, and
decide (engine/speculation/adaptive.py) how much to propose, or whether to propose at all.
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import time
from typing import Generic, TypeVar

import llama_cpp
import numpy as np

from ggufdesk.core.errors import KnownError
from ggufdesk.core.settings import SpeculationSettings
from ggufdesk.engine.speculation.adaptive import DraftLength
from ggufdesk.engine.batching.generate import Generator
from ggufdesk.engine.speculation.lookup import NgramCache, PromptLookup
from ggufdesk.engine.runtime.native import LlamaLog, LoadedModel, load_model, token_piece

log = logging.getLogger("ggufdesk.engine.speculation.speculative")

VOCAB_CHECK_START = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
VOCAB_MAX_SIZE_DIFF = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo2"}


def _text(vocab, i: int) -> bytes:
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


class DraftModel:
    """A second GGUF with its own context and KV cache, kept in sync with the target's history."""

    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.gen = Generator(lm)
        self.path = lm.path
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
        self.gen = None  # type: ignore[assignment]
        self.lm.close()

    def sync(self, seq: list[int]) -> float:
        """Make the draft's KV cache hold seq (reusing the common prefix); returns seconds spent."""
        t = time.perf_counter()
        kept = self.gen.reuse_prefix(seq)
        todo = seq[kept:]
        self.gen.prefill(todo)
        dt = time.perf_counter() - t
        if len(todo) >= 32:
            self.prefill_tok_s = len(todo) / max(dt, 1e-6)
        return dt

    def unsynced(self, seq: list[int]) -> int:
        n = 0
        for a, b in zip(self.gen.tokens, seq):
            if a != b:
                break
            n += 1
        return len(seq) - n

    def greedy(self, k: int, p_min: float, q_min: float = 0.0) -> list[int]:
        """Up to k greedy tokens after the synced sequence; stops when the top probability < p_min,
        or when the chance that the whole draft so far is accepted (the product of the draft's own
        top probabilities) falls below q_min: one more token would then cost more than it is worth."""
        out: list[int] = []
        q = 1.0
        while len(out) < k:
            row = self.gen.logits_row(-1)
            top = int(np.argmax(row))
            if p_min > 0 or q_min > 0:
                z = np.exp(row - row[top])
                p = 1.0 / float(z.sum())
                q *= p
                if p < p_min or (out and q < q_min):
                    break
            out.append(top)
            if len(out) < k:
                self.gen._decode([top], logits="last")
        return out


class DraftModelDrafter:
    """Drafter over a DraftModel: lazy sync at the first proposal, so time to first token is untouched."""

    def __init__(self, dm: DraftModel, spec: SpeculationSettings, *, prompt: list[int], max_tokens: int,
                 target: LoadedModel, costs: dict[int, float] | None = None) -> None:
        self.dm = dm
        self.p_min = spec.p_min
        self.control = DraftLength(k_min=spec.k_min, k_max=spec.k_max, adaptive=spec.adaptive, label="draft",
                                   k_start=min(spec.k_max, 4), costs=costs)
        self._overhead = 0.0
        self._sync_s = 0.0
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

    @property
    def k(self) -> int:
        return self.control.k

    @property
    def status(self) -> str:
        return self.control.status

    def propose(self, history: list[int], last: int, k: int) -> list[int]:
        seq = history + [last]
        if len(seq) + k >= self.dm.lm.n_ctx:
            self.control.disable(f"the draft's context ({self.dm.lm.n_ctx}) is full")
            return []
        t = time.perf_counter()
        sync_s = self.dm.sync(seq)
        q_min = self.control.marginal() if self.control.adaptive else 0.0
        out = self.dm.greedy(k, self.p_min, q_min)
        self._overhead = time.perf_counter() - t - sync_s
        self._sync_s = sync_s
        return out

    def feedback(self, n_drafted: int, n_accepted: int, seconds: float) -> None:
        sync_s, self._sync_s = self._sync_s, 0.0
        overhead, self._overhead = self._overhead, 0.0
        seconds = max(seconds - sync_s, 1e-6)  # catching up with the prompt is paid once, not per step
        self.control.feedback(n_drafted, n_accepted, seconds, overhead if n_drafted == 0 else 0.0)
        if self.control.spec_steps:
            self.dm.alpha_hint = self.control.alpha()
        if self.control.t0 is not None:
            self.dm.plain_s = self.control.t0


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
                 costs: dict[int, float] | None = None, text: TokenText | None = None):
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

