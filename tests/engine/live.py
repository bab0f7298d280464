"""The live step loop in the test process: the engine's own BatchEngine on a loaded model, stepped
until idle, with the KV cache open to inspection (llama_memory calls) and, where decisions depend on
step costs, a modelled clock instead of the machine's (tests must not depend on how busy it is)."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from ggufdesk.core.settings import LoadSettings, SamplingSettings, SpeculationSettings
from ggufdesk.engine.batching.batch import BatchEngine
from ggufdesk.engine.batching.sequence import RunStats, Sequence
from ggufdesk.engine.batching.vocab import Vocab
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime import heap
from ggufdesk.engine.runtime.native import LlamaLog, LoadedModel, load_model
from ggufdesk.engine.speculation.drafter import Drafter
from ggufdesk.engine.speculation.lookup import NgramCache
from ggufdesk.engine.speculation.speculative import TokenText, make_drafter

# A CPU as measured (the starter, 2 threads): a step of one row costs PLAIN_S; verifying k drafts
# alone 1.5 plain steps plus k/3; beside N decode rows a row adds about half a decode row's share.
PLAIN_S, FIXED_S, ROW_S = 0.010, 0.015, 0.003
COSTS = {1: 1.8, 3: 2.4, 7: 3.6, 15: 6.0}  # the matching verification table, in plain steps


def cpu_step(rows: int, logits: int) -> float:
    """Modelled seconds of a decode call: one pass over the weights, then a cost per row (prompt
    rows without logits cost a fifth of one with logits)."""
    with_logits = max(logits, 1)
    if rows == 1:
        return PLAIN_S
    return FIXED_S + ROW_S * (with_logits - 1) + ROW_S / 5 * (rows - with_logits)


class ModelClock:
    """A clock that moves only when the model decodes, by `cost(rows, rows with logits)`."""

    def __init__(self, cost: Callable[[int, int], float] = cpu_step) -> None:
        self.now, self.cost = 0.0, cost

    def __call__(self) -> float:
        return self.now

    def decode(self, ctx: Any, batch: Any) -> int:
        rc = int(llama_cpp.llama_decode(ctx, batch))
        logits = sum(1 for i in range(batch.n_tokens) if batch.logits[i])
        self.now += self.cost(batch.n_tokens, logits)
        return rc


@dataclass
class Result:
    rid: str
    done: P.Done | None = None
    error: P.Error | None = None
    stats: P.Stats | None = None
    text: str = ""
    tokens: list[int] = field(default_factory=list)


class Live:
    """A loaded model and the engine's step loop over it, in this process."""

    def __init__(self, model: Any, settings: LoadSettings, *, n_outputs: int = 17,
                 costs: dict[int, float] | None = None, clock: ModelClock | None = None) -> None:
        self.lm: LoadedModel = load_model(str(model), settings, LlamaLog(), n_outputs=n_outputs)
        self.vocab = Vocab(self.lm)
        self.events: list[Any] = []
        self.cancels: set[str] = set()
        self.clock = clock
        kw: dict[str, Any] = {} if clock is None else {"decode": clock.decode, "timer": clock}
        self.engine = BatchEngine(self.lm, self.vocab, emit=self.events.append, cancelled=self.cancels.__contains__,
                                  set_batch=lambda rids: None, verify_costs=costs, **kw)
        self._n = 0
        heap.settle()  # as the worker does after a load
        self.text: TokenText | None = None

    def close(self) -> None:
        self.lm.close()
        heap.release()

    def tokens(self, text: str) -> list[int]:
        return self.vocab.tokenize(text)

    def lookup(self, prompt: list[int], *, costs: dict[int, float] | None = None, history: NgramCache | None = None,
               **spec: Any) -> Drafter:
        """A prompt-lookup drafter for `prompt` (fixed K 8 unless told otherwise); `history`: what
        earlier requests left for it to draft from."""
        settings = SpeculationSettings(**{"mode": "lookup", "k_max": 8, "adaptive": False, **spec})
        if self.text is None:  # read as lookup asks, kept for the model's life (as the worker keeps it)
            self.text = TokenText.of(self.lm)
        d = make_drafter(settings, prompt=prompt, draft=None, target=self.lm, costs=costs, ngrams=history,
                         text=self.text)
        assert d is not None
        return d

    def sequence(self, prompt: list[int] | str, max_tokens: int, *, drafter: Drafter | None = None,
                 temperature: float = 0.0, seed: int = 7, stop: tuple[str, ...] = (), logprobs: int = 0,
                 rid: str | None = None) -> Sequence:
        toks = self.tokens(prompt) if isinstance(prompt, str) else list(prompt)
        self._n += 1
        sampling = SamplingSettings(temperature=temperature, seed=seed, max_tokens=max_tokens, stop=list(stop))
        return Sequence(rid=rid or f"r{self._n}", prompt=toks, sampling=sampling, logprobs=logprobs,
                        max_gen=min(max_tokens, self.lm.n_ctx - len(toks)), drafter=drafter,
                        stats=RunStats(n_prompt=len(toks), t_start=time.perf_counter()))

    def run(self, *seqs: Sequence, on_step: Callable[[Live], None] | None = None) -> list[Result]:
        """Submit every sequence (all are in the queue before the first step), step until idle."""
        self.events.clear()
        for s in seqs:
            self.engine.submit(s)
        while self.engine.busy:
            self.engine.step()
            if on_step is not None:
                on_step(self)
        return [self.result(s.rid) for s in seqs]

    def result(self, rid: str) -> Result:
        r = Result(rid)
        for ev in self.events:
            if getattr(ev, "id", None) != rid:
                continue
            if isinstance(ev, P.Token):
                r.text += ev.text
            elif isinstance(ev, P.Stats):
                r.stats = ev
            elif isinstance(ev, P.Done):
                r.done, r.tokens = ev, list(ev.tokens)
            elif isinstance(ev, P.Error):
                r.error = ev
        return r

    def plain(self, prompt: list[int] | str, max_tokens: int, **kw: Any) -> Result:
        return self.run(self.sequence(prompt, max_tokens, **kw))[0]

    def near_tie_at_divergence(self, prompt: list[int], plain: list[int], other: list[int], tol: float) -> float | None:
        """Where greedy outputs first differ, plain decoding's top-2 logit margin (None if identical).

        On a quantized model llama.cpp's CPU kernels for multi-row batches (verification, other
        streams' rows) are not bit-identical to its one-row kernels (~1 logit on the Q4_K starter
        after hundreds of tokens), so greedy output may legitimately flip at a near-tie; a flip at
        a clear margin would be a bug."""
        i = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b), None)
        if i is None:
            return None
        self.forget()
        self.run(self.sequence(prompt + plain[:i], 1, logprobs=2))
        entry = next(e for ev in self.events if isinstance(ev, P.Token) for e in ev.logprobs or [])
        margin = float(entry["top"][0]["logprob"] - entry["top"][1]["logprob"])
        assert margin < tol, f"divergence at token {i} with a clear margin {margin:.3f}: not numerics"
        return margin

    # ---- the KV cache -------------------------------------------------------------------------

    def positions(self, seq_id: int) -> tuple[int, int]:
        """(first, last) position llama.cpp holds for a sequence id ((-1, -1): none)."""
        mem = llama_cpp.llama_get_memory(self.lm.ctx.ctx)
        return (llama_cpp.llama_memory_seq_pos_min(mem, seq_id), llama_cpp.llama_memory_seq_pos_max(mem, seq_id))

    def check_kv(self) -> None:
        """Every slot's bookkeeping matches what llama.cpp holds for its sequence."""
        for slot in self.engine.slots.slots:
            want = (0, len(slot.tokens) - 1) if slot.tokens else (-1, -1)
            assert self.positions(slot.seq) == want, (slot.seq, self.positions(slot.seq), len(slot.tokens))

    def forget(self) -> None:
        """An empty KV cache (no prefix of an earlier run is reused)."""
        self.engine.mem.clear()
        self.engine.slots.reset()
