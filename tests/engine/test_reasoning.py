"""Reasoning through the real engine on scripted models: the split, the budget, the switches, and
earlier reasoning kept out of the next prompt; bad input ends clearly, loses no text, never hangs."""
from __future__ import annotations

import pytest

from ggufdesk.core.reasoning import THINK, strip_reasoning, template_switches
from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.link import protocol as P
from tests.fixtures.ggufs import CHATML_TEMPLATE
from tests.fixtures import scripted
from tests.fixtures.scripted import write_scripted

LOAD = LoadSettings(n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
QWEN = "<think>\nFirst I add two and two. That makes four. I am sure.\n</think>\n\nThe answer is four."
R1 = "Two plus two. Four.\n</think>\n\nFour."
HARMONY = ("<|channel|>analysis<|message|>Add them up, carefully, one by one.<|end|><|start|>assistant"
           "<|channel|>final<|message|>Four.")
HARMONY_LONG = ("<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>final<|message|>"
                "Two and two make four, as counting on your fingers shows: one, two, three, four. So the sum is four.")
USER = [{"role": "user", "content": "What is 2+2?"}]



def run(client, path, *, messages=USER, max_tokens=200, **extra):
    client.load(str(path), settings=LOAD)
    rid = client.generate(messages=messages, sampling={"temperature": 0.0, "max_tokens": max_tokens}, **extra)
    out = {"reasoning": "", "text": "", "done": None, "error": None}
    for ev in client.stream(rid, timeout=60):
        if isinstance(ev, P.Token):
            out["reasoning" if ev.reasoning else "text"] += ev.text
        elif isinstance(ev, P.Done):
            out["done"] = ev
        elif isinstance(ev, P.Error):
            out["error"] = ev
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("reasoning")
    return {"qwen3": write_scripted(d / "qwen3.gguf", "qwen3", QWEN),
            "r1": write_scripted(d / "r1.gguf", "deepseek-r1", R1),
            "harmony": write_scripted(d / "oss.gguf", "gpt-oss", HARMONY),
            "harmony_long": write_scripted(d / "oss_long.gguf", "gpt-oss", HARMONY_LONG),
            "endless": write_scripted(d / "endless.gguf", "qwen3", "<think>\nI keep thinking and never stop"),
            "unstripped": write_scripted(d / "plain.gguf", "qwen3", "Four.",
                                         chat_template="{# reasons in <think> #}" + CHATML_TEMPLATE)}


@pytest.mark.parametrize("name,reasoning,answer", [
    ("qwen3", "First I add two and two. That makes four. I am sure.", "The answer is four."),
    ("r1", "Two plus two. Four.", "Four."),
    ("harmony", "Add them up, carefully, one by one.", "Four."),
])
def test_reasoning_and_answer_apart_in_tokens_and_done(client, models, name, reasoning, answer):
    r = run(client, models[name])
    d = r["done"]
    assert (r["reasoning"], r["text"]) == (reasoning, answer) == (d.reasoning, d.text)
    assert d.finish_reason == "stop" and 0 < d.usage["reasoning_tokens"] < d.usage["completion_tokens"]


@pytest.mark.parametrize("name", ["qwen3", "r1", "harmony"])
@pytest.mark.parametrize("budget", [0, 1, 3])
def test_the_budget_closes_the_block_at_n_tokens_and_the_model_answers(client, models, name, budget):
    full = run(client, models[name])["done"]
    r = run(client, models[name], reasoning_budget=budget)
    d = r["done"]
    assert d.usage["reasoning_tokens"] == budget + 1  # N tokens of thinking, then the closing marker
    assert full.reasoning.startswith(d.reasoning) and len(d.reasoning) < len(full.reasoning)
    assert d.text == full.text and d.finish_reason == "stop"


@pytest.mark.parametrize("name", ["qwen3", "r1", "harmony"])
def test_a_budget_holds_with_prompt_lookup_drafting_around_it(client, models, name):
    """Drafts stop where the budget will be looked at (ReasoningControl.room): the same thinking, cut
    at the same token (or not at all), and the same answer as without speculation. The second of two identical
    requests drafts from the first's answer (the conversation's n-grams), across the whole budget."""
    from ggufdesk.core.settings import SpeculationSettings

    spec = SpeculationSettings(mode="lookup", adaptive=False, k_max=8)
    for budget in (0, 3, 6, 100):  # (100: the model closes the block itself, then answers unbounded)
        plain = run(client, models[name], reasoning_budget=budget)["done"]
        client.load(str(models[name]), settings=LOAD, speculation=spec)
        for _ in range(2):
            rid = client.generate(messages=USER, sampling={"temperature": 0.0, "max_tokens": 200},
                                  reasoning_budget=budget)
            events = list(client.stream(rid, timeout=60))
            done = next(e for e in events if isinstance(e, P.Done))
            stats = [e for e in events if isinstance(e, P.Stats)][-1]
            counts = [(d.usage["completion_tokens"], d.usage["reasoning_tokens"]) for d in (done, plain)]
            assert (done.reasoning, done.text, counts[0]) == (plain.reasoning, plain.text, counts[1]), budget
        assert stats.speculation.startswith("lookup") and stats.accepted > 0, (budget, stats)


def test_a_harmony_answer_drafts_once_its_final_message_began_however_little_budget_is_left(client, models):
    """gpt-oss thinks exactly its budget's worth and answers itself: nothing is left of the budget, yet
    the answer (its final message, after which no analysis can come) drafts from the first request's
    answer. Before, the budget's bound held to the end and the answer drafted nothing."""
    from ggufdesk.core.settings import SpeculationSettings

    path = models["harmony_long"]
    free = run(client, path)["done"]
    budget = free.usage["reasoning_tokens"]  # the model closes the block itself at exactly this count
    client.load(str(path), settings=LOAD, speculation=SpeculationSettings(mode="lookup", adaptive=False, k_max=8))
    for _ in range(2):
        rid = client.generate(messages=USER, sampling={"temperature": 0.0, "max_tokens": 200}, reasoning_budget=budget)
        events = list(client.stream(rid, timeout=60))
        done = next(e for e in events if isinstance(e, P.Done))
        assert (done.reasoning, done.text) == (free.reasoning, free.text)
    stats = [e for e in events if isinstance(e, P.Stats)][-1]
    assert stats.accepted > budget, stats  # more than the thinking could hold: the answer drafted


def test_max_tokens_inside_the_think_block_keeps_the_reasoning(client, models):
    r = run(client, models["qwen3"], max_tokens=4)
    d = r["done"]
    assert d.finish_reason == "length" and d.text == "" and d.reasoning == r["reasoning"]
    assert d.reasoning and "First I add two and two. That makes four.".startswith(d.reasoning)


def test_a_block_that_never_closes_is_all_reasoning_and_ends(client, models):
    d = run(client, models["endless"])["done"]
    assert (d.reasoning, d.text, d.finish_reason) == ("I keep thinking and never stop", "", "stop")


def test_think_off_uses_the_template_switch_or_a_zero_budget(client, models):
    on = run(client, models["qwen3"])["done"]
    off = run(client, models["qwen3"], think=False)["done"]
    assert off.usage["prompt_tokens"] > on.usage["prompt_tokens"]  # Qwen3's empty <think></think> in the prompt
    r1_off = run(client, models["r1"], think=False)["done"]  # R1's template has no switch
    assert (r1_off.reasoning, r1_off.text, r1_off.usage["reasoning_tokens"]) == ("", "Four.", 1)


def test_earlier_reasoning_is_not_in_the_next_prompt(client, models):
    """The rendered prompt with an earlier answer that carried its thinking is the one without it."""
    def history(answer):
        return [USER[0], {"role": "assistant", "content": answer}, {"role": "user", "content": "And 3+3?"}]

    for name in ("unstripped", "qwen3", "r1"):
        with_thinking = run(client, models[name], messages=history(
            "<think>\nA long secret chain of thought.\n</think>\n\nFour."), max_tokens=1)["done"]
        without = run(client, models[name], messages=history("Four."), max_tokens=1)["done"]
        assert with_thinking.usage["prompt_tokens"] == without.usage["prompt_tokens"], name


def test_a_bad_budget_is_refused_clearly(client, models):
    r = run(client, models["qwen3"], reasoning_budget=-5)
    assert r["error"] is not None and "reasoning_budget" in r["error"].message


def test_rendered_prompts_drop_reasoning_unless_the_template_keeps_it():
    from ggufdesk.engine.runtime.chat import ChatTemplate

    qwen = ChatTemplate(scripted.template("qwen3"), bos="", eos="<|im_end|>")
    turn = {"role": "assistant", "content": "A", "reasoning_content": "secret"}
    later = qwen.render(strip_reasoning([{"role": "user", "content": "q"}, turn,
                                           {"role": "user", "content": "next"}], THINK))
    assert "secret" not in later
    # in a tool loop (after the last user message) Qwen3's template keeps the thinking: it asks for it
    loop = qwen.render([{"role": "user", "content": "q"}, {**turn, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "42"}])
    assert "secret" in loop
    off = qwen.render([{"role": "user", "content": "q"}], **template_switches(qwen.source, False)[0])
    assert off.endswith("<think>\n\n</think>\n\n")
