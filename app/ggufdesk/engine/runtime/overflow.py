"""A prompt that outgrows the context, under the request's overflow policy; and what was dropped.

The policies (core/settings.py OVERFLOW_POLICIES, docs/context.md):

- ``error``: refused (the server's 400 ``context_length_exceeded``), nothing dropped;
- ``rolling``: the system prompt and the newest turns that fit; whole older turns are dropped (a
  raw prompt keeps its newest tokens);
- ``truncate-middle``: the start and the end of a long prompt; its middle is cut (in a chat, from
  the longest message, so the template's frame around the messages stays whole);
- ``shift``: the prompt is fitted as by ``rolling``; while generating, the oldest tokens after the
  system prompt leave the KV cache when it fills (engine/batching/shift.py).

The budget is the context minus the room kept for the answer (min(max_tokens, n_ctx / 2)). Whatever
is dropped is counted: the engine reports it in an Overflow event and in the request's Done.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ggufdesk.core.errors import KnownError
from ggufdesk.core.prompt_cache import common_prefix
from ggufdesk.engine.link.protocol import OverflowPolicy

Messages = list[dict[str, Any]]
Render = Callable[[Messages], list[int]]  # messages -> prompt tokens (template + tokenizer)
TooLong = Callable[[int, int], KnownError]  # (tokens, room) -> the request's context error
MIDDLE_TRIES = 4  # re-cuts when tokens merge differently across the cut
MIN_KEPT = 32  # a message cut to fewer tokens than this is no longer the message: messages go instead
# Rolling drops this share of the budget more than it must: without it every turn after the first drop
# moves the cut and prefills the whole conversation again (bench/context.py, replay: prefilled tokens
# per turn); llama-server's context shift discards half for the same reason. 0 = the strict newest-that-fit.
ROLL_SLACK = float(os.environ.get("GGUFDESK_ROLLING_SLACK", "0.25"))
HELD_SIGNATURE = 16  # tokens of a cached sequence that identify where an earlier cut started
Known = Callable[[], list[list[int]]]  # the token sequences the KV caches hold (memory, disk)


def _nothing() -> list[list[int]]:
    return []


@dataclass
class Fitted:
    """A prompt that fits, and what fitting it cost."""

    tokens: list[int]
    policy: OverflowPolicy  # the policy asked for
    truncated_tokens: int = 0  # prompt tokens dropped to fit
    dropped_messages: int = 0  # whole messages dropped (rolling)
    n_keep: int = 0  # leading tokens a context shift never discards (BOS, the system prompt)
    messages: Messages | None = None  # a chat's messages as they were rendered into `tokens`

    @property
    def applied(self) -> OverflowPolicy | None:
        """The policy that dropped tokens (None when nothing was dropped)."""
        return self.policy if self.truncated_tokens else None


def budget_for(n_ctx: int, max_tokens: int) -> int:
    """Prompt tokens a request may use: the context minus the room kept for its answer."""
    return n_ctx - min(max_tokens, n_ctx // 2)


def cut_middle(tokens: list[int], keep: int) -> list[int]:
    """The first and last tokens of `tokens`, `keep` in all (the first half rounded up)."""
    if keep >= len(tokens):
        return list(tokens)
    head = (keep + 1) // 2
    tail = keep - head
    return tokens[:head] + (tokens[len(tokens) - tail:] if tail else [])


# ---- raw prompts ------------------------------------------------------------------------------------


def fit_text(tokens: list[int], policy: OverflowPolicy, *, n_ctx: int, budget: int, bos_id: int | None,
             too_long: TooLong, known: Known = _nothing) -> Fitted:
    """A completion prompt's tokens under `policy`. `error` refuses only what can never fit (the
    answer then gets the room that is left, as llama-server does); the others keep room for it."""
    n_keep = 1 if tokens[:1] == [bos_id] else 0
    if policy == "error" or len(tokens) <= budget:
        if len(tokens) >= n_ctx:
            raise too_long(len(tokens), n_ctx - 1)
        return Fitted(list(tokens), policy, n_keep=n_keep)
    if policy == "truncate-middle":
        kept = cut_middle(tokens, budget)
    else:  # rolling, shift: the newest tokens (after the BOS), from a start a cache holds if it can
        start = _held_start(tokens, n_keep, len(tokens) - (budget - n_keep), known()) or \
            len(tokens) - (budget - n_keep) + int(budget * ROLL_SLACK)
        kept = tokens[:n_keep] + tokens[min(start, len(tokens) - 1):]
    return Fitted(kept, policy, truncated_tokens=len(tokens) - len(kept), n_keep=n_keep)


def _held_start(tokens: list[int], n_keep: int, first: int, cached: list[list[int]]) -> int | None:
    """Where a cached cut of this raw prompt starts (>= first): a sequence in a cache that is the
    prompt's head followed by the prompt from some later point (an earlier request rolled there)."""
    for seq in cached:
        sig = seq[n_keep:n_keep + HELD_SIGNATURE]
        if seq[:n_keep] != tokens[:n_keep] or len(sig) < HELD_SIGNATURE:
            continue
        for j in range(first, len(tokens) - len(sig) + 1):
            if tokens[j:j + len(sig)] == sig:
                return j
    return None


# ---- chats ------------------------------------------------------------------------------------------


def fit_chat(messages: Messages, policy: OverflowPolicy, *, render: Render, budget: int, too_long: TooLong,
             tokenize: Callable[[str], list[int]] | None = None,
             detokenize: Callable[[list[int]], str] | None = None, bos_id: int | None = None,
             known: Known = _nothing, n_ctx: int | None = None) -> Fitted:
    """A chat's prompt tokens under `policy` (truncate-middle needs tokenize/detokenize of message text;
    known() gives the token sequences the KV caches hold, which rolling prefers to cut at). Given
    `n_ctx`, `error` refuses only a prompt that can never fit, as fit_text does: the answer gets the
    room that is left (Claude Code asks max_tokens 32000 of a 32k context beside a 20k prompt)."""
    tokens = render(messages)
    limit = n_ctx - 1 if policy == "error" and n_ctx is not None else budget
    if len(tokens) <= limit:
        fitted = Fitted(tokens, policy, messages=messages)
    elif policy == "error":
        raise too_long(len(tokens), limit)
    elif policy == "truncate-middle":
        assert tokenize is not None and detokenize is not None
        fitted = _truncate_middle(messages, tokens, render=render, budget=budget, too_long=too_long,
                                  tokenize=tokenize, detokenize=detokenize)
    else:  # rolling, shift
        kept, kept_tokens, dropped = roll(messages, render, budget, too_long, known=known)
        fitted = Fitted(kept_tokens, policy, dropped_messages=dropped, truncated_tokens=len(tokens) - len(kept_tokens),
                        messages=kept)
    if policy == "shift":
        fitted.n_keep = system_keep(fitted.messages or messages, fitted.tokens, render,
                                    bos=fitted.tokens[:1] == [bos_id])
    return fitted


def roll(messages: Messages, render: Render, budget: int, too_long: TooLong, *,
         known: Known = _nothing) -> tuple[Messages, list[int], int]:
    """Drop the oldest turns (never the system prompt, never the last message) until the prompt fits:
    the kept messages, their tokens and how many were dropped. A conversation never starts with an
    answer or a tool result left without its call, so those go with the turn before them.

    When turns must go, the cut is one a KV cache already holds (an earlier request of this
    conversation cut there: its prefix is reused, not prefilled again), else one ROLL_SLACK of the
    budget deeper than needed, so the next turns find their prefix cached until that room is used up.
    """
    system = [m for m in messages[:1] if m.get("role") == "system"]
    rest = messages[len(system):]
    starts = [i for i in range(len(rest)) if i == len(rest) - 1 or rest[i].get("role") not in ("assistant", "tool")]
    fits: list[tuple[int, list[int]]] = []  # (start, tokens) from the first start that fits to the slack cut
    for i in starts:
        toks = render(system + rest[i:])
        if len(toks) <= budget:
            fits.append((i, toks))
            if i == 0 or len(toks) <= budget - int(budget * ROLL_SLACK):
                break
    if not fits:
        raise too_long(len(render(system + rest[-1:])), budget)
    start, toks = fits[0] if fits[0][0] == 0 else _sticky(fits, known()) or fits[-1]
    return system + rest[start:], toks, len(rest[:start])


def _sticky(fits: list[tuple[int, list[int]]], cached: list[list[int]]) -> tuple[int, list[int]] | None:
    """The cut whose prompt a cache holds beyond what every cut shares (the system prompt), if any."""
    if len(fits) < 2 or not cached:
        return None
    held = [max(common_prefix(c, toks) for c in cached) for _, toks in fits]
    best = max(range(len(fits)), key=lambda k: held[k])
    return fits[best] if held[best] > min(held) + HELD_SIGNATURE else None


def _truncate_middle(messages: Messages, tokens: list[int], *, render: Render, budget: int, too_long: TooLong,
                     tokenize: Callable[[str], list[int]], detokenize: Callable[[list[int]], str]) -> Fitted:
    """Cut the middle of the longest message (one long prompt); when that is not enough, leave out
    whole messages from the middle of the conversation (the system prompt, the first message and the
    newest ones stay), then cut the longest message that is left."""
    def cut(msgs: Messages) -> tuple[Messages, list[int]] | None:
        return _cut_longest(msgs, render=render, budget=budget, tokenize=tokenize, detokenize=detokenize)

    kept = cut(messages)
    dropped = 0
    if kept is None:
        middle, dropped = drop_middle(messages, lambda m: len(render(m)), budget)
        kept = middle, render(middle)
        if len(kept[1]) > budget:
            kept = cut(middle)
    if kept is None:
        raise too_long(len(tokens), budget)
    return Fitted(kept[1], "truncate-middle", truncated_tokens=len(tokens) - len(kept[1]), dropped_messages=dropped,
                  messages=kept[0])


def _cut_longest(messages: Messages, *, render: Render, budget: int, tokenize: Callable[[str], list[int]],
                 detokenize: Callable[[list[int]], str]) -> tuple[Messages, list[int]] | None:
    """The messages with the middle of the longest one cut so that they fit, and their prompt (None:
    that message cannot give enough and keep MIN_KEPT of its tokens)."""
    texts = [c if isinstance(c := m.get("content"), str) else "" for m in messages]
    i = max(range(len(messages)), key=lambda j: len(texts[j]))
    body = tokenize(texts[i])
    keep = len(body) - (len(render(messages)) - budget)
    for _ in range(MIDDLE_TRIES):
        if keep < MIN_KEPT:
            return None
        text = detokenize(cut_middle(body, keep))
        if text[:1].isspace() and not texts[i][:1].isspace():
            text = text[1:]  # the tokenizer's own leading space (SentencePiece's dummy prefix)
        shorter = [*messages[:i], {**messages[i], "content": text}, *messages[i + 1:]]
        kept = render(shorter)
        if len(kept) <= budget:
            return shorter, kept
        keep -= len(kept) - budget
    return None


def drop_middle(messages: Messages, count: Callable[[Messages], int], budget: int) -> tuple[Messages, int]:
    """Leave out whole messages after the first one (and the system prompt) until the rest fits or only
    the newest is left; the next kept message is an answer when one can be, so turns still alternate."""
    head = messages[:2] if messages[:1] and messages[0].get("role") == "system" else messages[:1]
    rest = messages[len(head):]
    while len(rest) > 1 and count(head + rest) > budget:
        rest = rest[1:]
        while len(rest) > 1 and rest[0].get("role") != "assistant":
            rest = rest[1:]
    return head + rest, len(messages) - len(head) - len(rest)


def system_keep(messages: Messages, tokens: list[int], render: Render, *, bos: bool) -> int:
    """Leading prompt tokens that hold the system prompt (and the BOS): a context shift keeps them."""
    base = 1 if bos and tokens else 0
    if not messages or messages[0].get("role") != "system":
        return base
    try:
        alone = render([messages[0], {"role": "user", "content": ""}])
    except KnownError:  # a template that refuses that shape: keep the BOS only
        return base
    return max(base, common_prefix(alone, tokens))
