"""After a step: the tokens each sequence got become text, limits and lifecycle, written once.

`take` is the only place a token is judged (end of generation, stop strings, max_tokens, the
context's room), whether it came from plain decoding, an accepted draft or a forced write; a
token that ends a sequence ends it there, and the tokens after it in the same step (the rest of an
accepted draft) are dropped, with their KV rows, so the cache then holds what plain decoding
would (vLLM v1's update_from_output: append each output token, check_stop, cut the rest).
`finish` and `fail` are the only ways out.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.batching.prefix_cache import Slot, Slots
from ggufdesk.engine.batching.runner import SeqOutput, StepResult
from ggufdesk.engine.batching.sampling import llama_perf
from ggufdesk.engine.batching.scheduler import Scheduler
from ggufdesk.engine.batching.sequence import FINISH_REASONS, Sequence, SequenceStatus
from ggufdesk.engine.batching.vocab import Vocab
from ggufdesk.engine.link import protocol as P
from ggufdesk.engine.runtime.llama_typed import close
from ggufdesk.engine.runtime.native import LoadedModel
from ggufdesk.engine.runtime.tokens import applied_bias

STATS_EVERY_S = 0.25

TokenHook = Callable[[Sequence, int], None]


class Update:
    """Takes a step's outputs into its sequences and sends their events.

    token_hooks: called with each token a sequence takes and goes on after (a reasoning budget
    may `Sequence.force` the tokens that close a think block). on_plain_done(stats): a request
    that ran alone without speculation ended (its final Stats). on_finished(slot): a sequence
    ended with a Done, its KV kept in `slot` (the prompt states queue it: prompt_states.py).
    """

    def __init__(self, lm: LoadedModel, vocab: Vocab, sched: Scheduler[Sequence], slots: Slots, *,
                 emit: Callable[[Any], None], cancelled: Callable[[str], bool],
                 on_plain_done: Callable[[P.Stats], None] | None = None,
                 on_finished: Callable[[Slot], object] | None = None) -> None:
        self.lm, self.vocab, self.sched, self.slots = lm, vocab, sched, slots
        self.emit, self.cancelled, self.on_plain_done = emit, cancelled, on_plain_done
        self.on_finished = on_finished
        self.token_hooks: list[TokenHook] = []
        self.threads: Callable[[], int] = lambda: 0  # decode threads now, for Stats (the engine sets it)

    def apply(self, result: StepResult) -> None:
        for out in result.outputs:
            s = out.seq
            if out.error is not None:
                self.fail(s, out.error)
            elif self.cancelled(s.rid):  # a cancel that came during the step: nothing more of it is shown
                self.finish(s, SequenceStatus.FINISHED_CANCELLED)
            else:
                if out.prompt_done:
                    self._progress(s, out)
                self._take_all(s, out)

    def _progress(self, s: Sequence, out: SeqOutput) -> None:
        base = s.stats.n_reused
        self.emit(P.Progress(id=s.rid, phase="prefill", done=s.n_done - base, total=len(s.prompt) - base,
                             n_prompt=len(s.prompt)))
        if out.tokens:
            s.stats.t_prefill_end = time.perf_counter()

    def _take_all(self, s: Sequence, out: SeqOutput) -> None:
        for t, lp in zip(out.tokens, out.logprobs):
            at = s.kv_end  # where t would go in the KV cache
            end = self.take(s, t, lp)
            if end is not None:
                self.finish(s, end, keep=at)
                return
            for hook in self.token_hooks:
                hook(s, t)
        if out.tokens:
            s.status = SequenceStatus.DECODING

    def take(self, s: Sequence, t: int, lp: dict[str, Any] | None) -> SequenceStatus | None:
        """A token for s: emit it, or say how it ends s (the one place a token is judged)."""
        st = s.stats
        if lp is not None:
            s.pending_lp.append(lp)
        if self.vocab.is_eog(t):
            return SequenceStatus.FINISHED_STOP
        st.n_gen += 1
        st.tokens.append(t)
        now = time.perf_counter()
        st.t_first = st.t_first or now
        st.t_last = now
        assert s.stream is not None
        self._text_out(s, s.stream.push(self.vocab.piece(t)))
        if s.stream.stopped:
            return SequenceStatus.FINISHED_STOP
        if st.n_gen >= s.max_gen:  # (a `shift` request has no edge: BatchEngine._make_room)
            full = s.max_gen < s.sampling.max_tokens
            return SequenceStatus.FINISHED_CONTEXT if full else SequenceStatus.FINISHED_LENGTH
        s.last = t
        if now >= s.next_stats:
            self.emit(self.stats(s, final=False))
            s.next_stats = now + STATS_EVERY_S
        return None

    def _text_out(self, s: Sequence, text: str, *, final: bool = False) -> None:
        if s.reasoning is not None:  # a reasoning model: its thinking and its answer apart
            parts = s.reasoning.take(text) if text else []
            for is_reasoning, piece in parts + (s.reasoning.finish() if final else []):
                self._emit_text(s, piece, is_reasoning)
        elif text:
            self._emit_text(s, text, False)

    def _emit_text(self, s: Sequence, text: str, reasoning: bool) -> None:
        lp, s.pending_lp = (s.pending_lp or None), []
        if lp and not reasoning and not s.pieces and s.stream is not None and s.stream.trim:
            lp = lead_trimmed(lp)  # the answer's leading whitespace was dropped: so is its tokens'
        (s.thoughts if reasoning else s.pieces).append(text)
        self.emit(P.Token(id=s.rid, text=text, logprobs=lp if s.logprobs else None, reasoning=reasoning))

    def stats(self, s: Sequence, *, final: bool) -> P.Stats:
        st = s.stats
        spec = st.speculation if s.drafter is None else s.drafter.status
        return P.Stats(
            id=s.rid, n_prompt=st.n_prompt, n_reused=st.n_reused, n_gen=st.n_gen,
            ttft_s=round(st.ttft_s, 4), prefill_tok_s=round(st.prefill_tok_s, 2),
            decode_tok_s=round(st.decode_tok_s, 2), drafted=st.drafted, accepted=st.accepted,
            draft_len=st.draft_len, drafts=st.drafts, speculation=spec, threads=self.threads(), final=final,
            llama_perf=(llama_perf(self.lm) if s.alone else {}) if final else {},
        )

    # ---- the ways out -------------------------------------------------------------------------

    def release(self, s: Sequence, keep: int | None = None) -> None:
        """Free what s holds; its KV stays resident for later prefixes (the first `keep` positions)."""
        self.sched.remove(s)
        if s.sampler is not None:
            close(s.sampler)
            s.sampler = None
        if s.constraint is not None:
            s.constraint.close()
            s.constraint = None
        if s.drafter is not None:
            s.drafter.close()
        if s.slot is not None:
            if keep is not None:
                self.slots.truncate(s.slot, keep)  # tokens after the end (the rest of a draft) are not kept
            if s.slot.exact is not None:  # after a context shift only the part before it is exact
                self.slots.truncate(s.slot, s.slot.exact)
            self.slots.release(s.slot)
            s.slot = None

    def finish(self, s: Sequence, end: SequenceStatus, keep: int | None = None) -> None:
        """End s with a Done. keep: KV positions to keep (default: those of the tokens it emitted)."""
        started, slot = s.status is not SequenceStatus.WAITING, s.slot
        s.status = end
        self.release(s, s.kv_end if keep is None else keep)
        if slot is not None and self.on_finished is not None:
            self.on_finished(slot)
        if end is SequenceStatus.FINISHED_CANCELLED:
            self.emit(P.Done(id=s.rid, finish_reason="cancelled", text="".join(s.pieces), tokens=s.stats.tokens,
                             usage=self._usage(s), reasoning=self._thoughts(s), overflow=s.ctx.applied or ""))
            return
        if s.stream is not None:
            self._text_out(s, s.stream.flush(), final=True)
        final = self.stats(s, final=True)
        self.emit(final)
        self.emit(self._done(s, FINISH_REASONS[end]))
        if started and s.alone and s.drafter is None and self.on_plain_done is not None:
            self.on_plain_done(final)  # the figures the user saw

    def _done(self, s: Sequence, reason: P.FinishReason) -> P.Done:
        """The Done of a sequence that ended by itself: its text, tool calls, stop string, reasoning."""
        text = "".join(s.pieces)
        parsed = s.structured.parse(text) if s.structured is not None else None
        calls = parsed.calls if parsed is not None else []
        if calls and reason == "stop":
            reason = "tool_calls"
        usage = self._usage(s)
        if s.reasoning is not None:
            usage["reasoning_tokens"] = s.reasoning.tokens
        return P.Done(id=s.rid, finish_reason=reason, text=text, tokens=s.stats.tokens, usage=usage,
                      overflow=s.ctx.applied or "",
                      tool_calls=calls, content=parsed.content if calls and parsed is not None else None,
                      stop=s.stream.matched if s.stream is not None and reason == "stop" else None,
                      reasoning=self._thoughts(s), warnings=parsed.warnings if parsed is not None else [],
                      logit_bias=applied_bias(s.bias))

    @staticmethod
    def _usage(s: Sequence) -> dict[str, int]:
        """Token counts, what came from a cache (memory or disk) and what the overflow policy dropped."""
        st, c = s.stats, s.ctx
        usage = {"prompt_tokens": st.n_prompt, "completion_tokens": st.n_gen, "cached_tokens": st.n_reused,
                 "restored_tokens": c.restored, "truncated_tokens": c.truncated}
        if s.media is not None:
            m = s.media
            usage.update(image_tokens=m.image_tokens, images=len(m.spans), images_encoded=m.n_encoded,
                         images_cached=m.n_cached)
        return usage

    @staticmethod
    def _thoughts(s: Sequence) -> str | None:
        return "".join(s.thoughts) if s.reasoning is not None else None

    def expire(self, s: Sequence) -> None:
        """Past its deadline: end s with a timeout error (what it produced so far has been streamed)."""
        if s.stream is not None:
            self._text_out(s, s.stream.flush())
        s.status = SequenceStatus.EXPIRED
        self.release(s, s.kv_end)
        self.emit(P.Error(kind="timeout", id=s.rid, message=(
            f"the request was stopped after {s.limit_s:g} s ({s.stats.n_gen} tokens generated): it took "
            "longer than the engine allows it (ggufdesk serve --request-timeout)")))

    def fail(self, s: Sequence, e: KnownError) -> None:
        """End s with an Error; what its KV sequence holds is not to be trusted."""
        slot = s.slot
        s.status = SequenceStatus.FAILED
        self.release(s)
        if slot is not None:
            self.slots.clear(slot)
        self.emit(P.Error(kind=P.error_kind(e), id=s.rid, message=str(e)))


def lead_trimmed(lps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first tokens' logprob entries without the whitespace a chat answer's start drops (TextStream's
    trim), so that the tokens joined are the answer, as OpenAI's logprobs are (" Hi" -> "Hi")."""
    out: list[dict[str, Any]] = []
    for i, e in enumerate(lps):
        token = e.get("token", "").lstrip()
        out.append({**e, "token": token})
        if token:
            return out + lps[i + 1:]
    return out
