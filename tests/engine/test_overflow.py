"""The overflow policies on a stand-in template and tokenizer (one token per word): exactly what each keeps."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufdesk.core.errors import KnownError
from ggufdesk.engine.runtime import overflow as O

BOS = 1


class TooLong(KnownError):
    def __init__(self, n: int, room: int) -> None:
        super().__init__(f"{n} > {room}")
        self.n, self.room = n, room


VOCAB: dict[str, int] = {}
TEXT: dict[int, str] = {}


def words(text: str) -> list[int]:
    """One token per word, each word its own id."""
    out = []
    for w in text.split():
        if w not in VOCAB:
            VOCAB[w] = len(VOCAB) + 10
            TEXT[VOCAB[w]] = w
        out.append(VOCAB[w])
    return out


def render(messages: list[dict]) -> list[int]:
    """'<role> words... </>' per message, then '<assistant>': one token per word, BOS first."""
    out = [BOS]
    for m in messages:
        out += [2] + words(m["role"]) + words(m["content"]) + [3]
    return out + [2] + words("assistant")


def detok(tokens: list[int]) -> str:
    return " ".join(TEXT[t] for t in tokens)


tok = words


def chat(n_turns: int, system: str = "be brief") -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    for i in range(n_turns):
        msgs += [{"role": "user", "content": f"question {i} " + "word " * 8},
                 {"role": "assistant", "content": f"answer {i} " + "text " * 8}]
    return msgs + [{"role": "user", "content": "last question"}]


def fit(messages, policy, budget):
    return O.fit_chat(messages, policy, render=render, budget=budget, too_long=TooLong, tokenize=tok,
                      detokenize=detok, bos_id=BOS)


def test_a_prompt_that_fits_is_untouched_under_every_policy():
    msgs = chat(2)
    for policy in ("error", "rolling", "truncate-middle", "shift"):
        f = fit(msgs, policy, 1000)
        assert f.tokens == render(msgs) and f.truncated_tokens == 0 and f.applied is None


def test_error_refuses_with_the_numbers():
    msgs = chat(10)
    with pytest.raises(TooLong) as e:
        fit(msgs, "error", 100)
    assert (e.value.n, e.value.room) == (len(render(msgs)), 100)


@pytest.fixture
def strict(monkeypatch):
    """Rolling without its slack: exactly the newest turns that fit."""
    monkeypatch.setattr(O, "ROLL_SLACK", 0.0)


def test_rolling_keeps_the_system_prompt_and_the_newest_whole_turns_that_fit(strict):
    msgs = chat(10)
    f = fit(msgs, "rolling", 100)
    kept = [msgs[0]] + msgs[1 + f.dropped_messages:]
    assert f.tokens == render(kept) and len(f.tokens) <= 100
    assert kept[1]["role"] == "user"  # never an answer first
    one_more = [msgs[0]] + msgs[f.dropped_messages:]  # one more older message would not fit
    assert len(render(one_more)) > 100 or one_more[1]["role"] == "assistant"
    assert f.truncated_tokens == len(render(msgs)) - len(f.tokens) and f.applied == "rolling"
    assert f.dropped_messages == len(msgs) - len(kept)


def test_rolling_refuses_only_a_last_message_that_alone_is_too_long():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "word " * 200}]
    with pytest.raises(TooLong):
        fit(msgs, "rolling", 100)


def test_rolling_drops_a_tool_result_with_the_call_before_it(strict):
    msgs = [{"role": "user", "content": "old " * 40}, {"role": "assistant", "content": "calls"},
            {"role": "tool", "content": "result " * 10}, {"role": "assistant", "content": "so"},
            {"role": "user", "content": "now"}]
    kept, tokens, dropped = O.roll(msgs, render, 20, TooLong)
    assert kept == msgs[-1:] and dropped == 4 and tokens == render(kept)


def test_rolling_cuts_deeper_once_then_keeps_its_cut_while_a_cache_holds_it():
    msgs = chat(30)
    budget = 200
    first = fit(msgs, "rolling", budget)
    strict_start = next(i for i in range(1, len(msgs)) if msgs[i]["role"] == "user"
                        and len(render([msgs[0]] + msgs[i:])) <= budget)
    assert len(first.tokens) <= budget - budget * O.ROLL_SLACK  # room for the next turns
    assert first.dropped_messages > strict_start - 1
    cut = 1 + first.dropped_messages
    # the next turn: the answer and a new question; the cache holds the first request's prompt
    grown = msgs + [{"role": "assistant", "content": "fine"}, {"role": "user", "content": "and then"}]
    again = O.fit_chat(grown, "rolling", render=render, budget=budget, too_long=TooLong, bos_id=BOS,
                       known=lambda: [first.tokens + [7, 7]])
    assert again.dropped_messages == first.dropped_messages  # the same cut: its prefix is reused
    assert again.tokens[:len(first.tokens) - 2] == first.tokens[:-2]
    cold = O.fit_chat(grown, "rolling", render=render, budget=budget, too_long=TooLong, bos_id=BOS)
    assert cold.dropped_messages != again.dropped_messages and cut > 1  # without a cache: a fresh, deeper cut


def test_truncate_middle_keeps_the_start_and_the_end_of_one_long_message():
    body = " ".join(f"w{i}" for i in range(300))
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": body}]
    f = fit(msgs, "truncate-middle", 120)
    full = render(msgs)
    assert len(f.tokens) <= 120 and f.truncated_tokens == len(full) - len(f.tokens) and f.dropped_messages == 0
    head, tail = f.tokens[:40], f.tokens[-40:]
    assert full[:40] == head and full[-40:] == tail  # system prompt, the message's start, its end
    kept_words = [w for w in detok([t for t in f.tokens if t in TEXT]).split() if w.startswith("w")]
    assert kept_words[0] == "w0" and kept_words[-1] == "w299" and "w150" not in kept_words


def test_truncate_middle_leaves_out_middle_turns_when_no_single_message_is_long():
    msgs = chat(10)
    f = fit(msgs, "truncate-middle", 100)
    assert len(f.tokens) <= 100 and f.dropped_messages > 0
    kept = msgs[:2] + msgs[2 + f.dropped_messages:]
    assert f.tokens == render(kept)  # system, first question, then the newest turns
    assert kept[2]["role"] == "assistant"  # turns still alternate


def test_shift_fits_like_rolling_and_keeps_the_system_prompt_from_shifting():
    msgs = chat(10)
    f = fit(msgs, "shift", 100)
    assert f.tokens == fit(msgs, "rolling", 100).tokens and f.applied == "shift"
    system = render([msgs[0], {"role": "user", "content": ""}])
    assert f.tokens[:f.n_keep] == system[:f.n_keep] and f.n_keep >= len(render([msgs[0]])) - 3
    assert fit([{"role": "user", "content": "hi"}], "shift", 100).n_keep == 1  # no system prompt: the BOS


@pytest.mark.parametrize("policy", ["rolling", "shift"])
def test_a_raw_prompt_keeps_its_bos_and_newest_tokens(policy, strict):
    tokens = [BOS] + list(range(100, 400))
    f = O.fit_text(tokens, policy, n_ctx=256, budget=200, bos_id=BOS, too_long=TooLong)
    assert f.tokens == [BOS] + tokens[-199:] and f.truncated_tokens == 101 and f.n_keep == 1


def test_a_raw_prompt_rolls_deeper_once_then_keeps_a_cached_start():
    tokens = [BOS] + list(range(100, 400))
    f = O.fit_text(tokens, "rolling", n_ctx=256, budget=200, bos_id=BOS, too_long=TooLong)
    assert f.tokens == [BOS] + tokens[-(199 - 50):]  # a quarter of the budget deeper
    grown = tokens + list(range(400, 420))
    again = O.fit_text(grown, "rolling", n_ctx=256, budget=200, bos_id=BOS, too_long=TooLong,
                       known=lambda: [f.tokens])
    assert again.tokens[:len(f.tokens)] == f.tokens and len(again.tokens) == len(f.tokens) + 20


def test_a_raw_prompt_under_truncate_middle_and_error():
    tokens = [BOS] + list(range(100, 400))
    f = O.fit_text(tokens, "truncate-middle", n_ctx=256, budget=200, bos_id=BOS, too_long=TooLong)
    assert f.tokens == tokens[:100] + tokens[-100:] and f.truncated_tokens == 101
    # error refuses only what can never fit: the answer gets whatever room is left
    assert O.fit_text(tokens[:250], "error", n_ctx=256, budget=200, bos_id=BOS, too_long=TooLong).truncated_tokens == 0
    with pytest.raises(TooLong):
        O.fit_text(tokens, "error", n_ctx=256, budget=200, bos_id=BOS, too_long=TooLong)


def test_the_budget_keeps_room_for_the_answer():
    assert O.budget_for(4096, 512) == 3584 and O.budget_for(4096, 32000) == 2048 and O.budget_for(256, 40) == 216


# ---- drawn conversations --------------------------------------------------------------------------

TURNS = st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.integers(0, 60)), min_size=0, max_size=12)


@settings(derandomize=True, max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(system=st.integers(-1, 40), turns=TURNS, last=st.tuples(st.sampled_from(["user", "tool"]), st.integers(0, 60)),
       policy=st.sampled_from(["rolling", "truncate-middle", "shift", "error"]), budget=st.integers(8, 200))
def test_a_drawn_conversation_fits_its_budget_and_keeps_what_its_policy_promises(system, turns, last, policy, budget):
    msgs = ([{"role": "system", "content": "sys " * system}] if system >= 0 else []) + [
        {"role": r, "content": f"m{i} " + "w " * n} for i, (r, n) in enumerate([*turns, last])]
    n_ctx = budget + 16
    whole = render(msgs)
    try:
        f = O.fit_chat(msgs, policy, render=render, budget=budget, too_long=TooLong, tokenize=tok, detokenize=detok,
                       bos_id=BOS, n_ctx=n_ctx)
    except TooLong:
        assert policy == "error" and len(whole) > n_ctx - 1 or policy != "error" and len(whole) > budget
        return
    assert f.tokens == render(f.messages or msgs)
    assert len(f.tokens) <= (n_ctx - 1 if policy == "error" else budget)
    assert f.truncated_tokens == len(whole) - len(f.tokens) >= 0
    kept = f.messages or msgs
    head = 1 if system >= 0 else 0
    if policy in ("rolling", "shift"):
        rest, kept_rest = msgs[head:], kept[head:]
        assert kept[:head] == msgs[:head] and kept_rest == rest[len(rest) - len(kept_rest):] and kept[-1] == msgs[-1]
        assert len(kept_rest) == len(rest) or kept_rest[0]["role"] not in ("assistant", "tool") or len(kept_rest) == 1
        assert f.dropped_messages == len(rest) - len(kept_rest)
    if policy == "truncate-middle":  # the messages kept, in order; at most one of them cut in its middle
        cut = [m for m in kept if m not in msgs]
        assert len(cut) <= 1 and [m for m in kept if m in msgs] == [m for m in msgs if m in kept]
    if policy == "shift":
        assert 1 <= f.n_keep <= len(f.tokens)
        if system >= 0:
            assert f.tokens[:f.n_keep] == render([msgs[0], {"role": "user", "content": ""}])[:f.n_keep]
