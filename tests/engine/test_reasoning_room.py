"""ReasoningControl.room: how many drafts a step may carry beside a reasoning budget (the planner's
bound, engine/speculation/planner.py), as the thinking is taken token by token."""
from __future__ import annotations

from ggufdesk.core.reasoning import HARMONY, THINK
from ggufdesk.engine.structured.reasoning import ReasoningControl


def control(fmt=THINK, budget: int | None = 5) -> ReasoningControl:
    return ReasoningControl(fmt, inside=False, budget=budget, close_tokens=[7])


def test_drafts_stop_short_of_the_budget_while_the_block_may_still_be_open():
    c = control()
    assert c.room() == 4  # not opened yet: a step may open it and think up to the budget
    for piece in ("<think>", "\n", "a", " b"):
        c.take(piece)
    assert c.tokens == 3 and c.room() == 1  # two more samples reach the budget: one draft row
    c.take(" c")
    assert c.room() == 0
    c.take(" d")
    assert c.forced() == 7 and c.room() is None  # the budget closes the block: closing tokens one a sample


def test_a_block_the_model_closed_itself_leaves_the_answer_unbounded():
    c = control(budget=4)
    for piece in ("<think>", "a", " b", "</think>", "\n\nThe"):
        c.take(piece)
    assert c.tokens == 3 and c.room() is None  # (budget - tokens - 1 would be 0: no drafts in the answer)
    plain = control()
    plain.take("The answer")  # no block: the answer began
    assert plain.room() is None
    assert control(budget=None).room() is None


def test_harmony_can_think_again_after_a_preamble_but_not_after_its_final_message():
    c = control(HARMONY, budget=6)
    for piece in ("<|channel|>analysis<|message|>", "a", "<|end|>",
                  "<|start|>assistant<|channel|>commentary<|message|>", "Let me check."):
        c.take(piece)
    assert c.room() == 3  # a preamble to the user: analysis may open again, the budget still counts
    c.take("<|end|><|start|>assistant<|channel|>analysis<|message|>")
    c.take("b")
    assert c.tokens == 3 and c.room() == 2
    c.take("<|end|><|start|>assistant<|channel|>final<|message|>")
    c.take("Four")
    assert c.room() is None  # the final message ends the output (<|return|>): nothing left to bound
    c.take("<|end|><|start|>assistant<|channel|>analysis<|message|>")  # malformed: thinks after its answer
    assert c.tokens == 4 and c.room() == 1  # bounded again, the count where it was
    call = control(HARMONY, budget=6)
    call.take("<|start|>assistant<|channel|>commentary to=functions.add<|message|>")
    assert call.room() == 5  # a tool call's message is not the final one either


def test_text_that_is_not_harmony_at_all_settles_at_once():
    c = control(HARMONY, budget=6)
    c.take("Four, plainly.")
    assert c.room() is None
