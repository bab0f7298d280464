"""Adaptive lookup must not lock itself out, on the live step loop with the real starter model (slow
tier): a long copy after long free text in the same answer, and copy tasks in other languages than
the suite it was tuned on. Step costs are modelled (tests/engine/live.py: ModelClock), so the
controller's decisions do not depend on how busy the machine is; the assertions count accepted and
drafted tokens, never time."""
from __future__ import annotations

import pytest

from ggufdesk.core.settings import LoadSettings
from ggufdesk.engine.batching.sequence import Sequence
from tests.engine.live import COSTS, Live, ModelClock

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a hang guard: minutes on a loaded 2-core machine

GERMAN = ("Der Leuchtturm von Westerhever steht seit 1908 auf einer Warft mitten in den Salzwiesen. Er ist "
          "vierzig Meter hoch und wird von zwei Wärterhäusern flankiert. Bis 1978 lebten dort drei Familien, "
          "die abwechselnd das Licht bewachten.")
JAPANESE = ("静岡県は日本で最も多くの緑茶を生産している。茶畑は富士山のふもとから海の近くまで広がっている。"
            "新茶は四月の終わりから五月にかけて摘まれる。摘んだ葉はすぐに蒸して、発酵を止める。")
ENGLISH = ("The ferry to the island leaves the harbour at seven every morning and returns at six in the evening. "
           "In summer a second boat runs at noon, and bicycles travel free of charge. Tickets are sold on board, "
           "and children under five do not pay.")


@pytest.fixture(scope="module")
def live(starter_model):
    lv = Live(starter_model, LoadSettings(n_ctx=2048, n_threads=1, n_threads_batch=1), costs=COSTS, clock=ModelClock())
    yield lv
    lv.close()


def counts(live: Live, prompt: list[int], n: int, *, k_max: int, adaptive: bool, **kw) -> tuple[int, int, int]:
    """(accepted, drafted, generated) of one answer with prompt lookup."""
    live.forget()
    d = live.lookup(prompt, k_max=k_max, adaptive=adaptive, costs=COSTS)
    (r,) = live.run(live.sequence(prompt, n, drafter=d, **kw))
    assert r.stats is not None
    return r.stats.accepted, r.stats.drafted, r.stats.n_gen


@pytest.mark.parametrize("source,ask", [(GERMAN, "Der gleiche Text, wörtlich abgeschrieben:\n"),
                                        (JAPANESE, "同じ文章をそのまま書き写す：\n")])
def test_a_copy_task_in_another_language_is_drafted_like_fixed_k_drafts_it(live, source, ask):
    prompt = live.tokens(f"Text:\n{source}\n\n{ask}{source[:12]}")
    fixed, drafted_fixed, n = counts(live, prompt, 96, k_max=8, adaptive=False)
    assert fixed >= 0.5 * n, (fixed, drafted_fixed, n)  # the model does copy: drafts pay
    adaptive, drafted, n_ad = counts(live, prompt, 96, k_max=16, adaptive=True)
    assert adaptive >= 0.8 * fixed, f"adaptive accepted {adaptive} of {drafted} drafted, fixed K=8 {fixed}"


def test_a_long_copy_after_long_free_text_is_drafted(live):
    """Sampled free writing first (its drafts fail: lookup judges the text uncopyable), then the
    answer turns to copying the passage (written in by `Sequence.force`, as a client's next
    instruction would be): the copy must be drafted, not locked out by what came before."""
    prompt = live.tokens(f"Notice: {ENGLISH}\n\nA short story about the island:\n")
    instruction = live.tokens(f"\n\nThe notice again, copied exactly:\n{ENGLISH[:40]}")[1:]
    seen: dict[str, int] = {}

    def turn_to_copy(lv: Live) -> None:
        for s in lv.engine.sched.running:
            if "free" not in seen and s.stats.n_gen >= 160:
                seen.update(free=s.stats.n_gen, drafted=s.stats.drafted, accepted=s.stats.accepted)
                Sequence.force(s, instruction)

    live.forget()
    d = live.lookup(prompt, k_max=16, adaptive=True, costs=COSTS)
    (r,) = live.run(live.sequence(prompt, 160 + len(instruction) + 80, drafter=d, temperature=0.8, seed=3),
                    on_step=turn_to_copy)
    assert r.stats is not None and "free" in seen
    copy_accepted = r.stats.accepted - seen["accepted"]
    copied = r.stats.n_gen - seen["free"] - len(instruction)
    assert seen["accepted"] < 0.5 * seen["free"]  # the free text was not copyable
    assert copy_accepted >= 0.4 * copied, (copy_accepted, r.stats.drafted - seen["drafted"], copied)
