"""Honest gauges: decode speed over a recent window, prefill on the tokens actually read, no idle bar."""
from __future__ import annotations

from ggufdesk.engine.link import protocol as p
from ggufdesk.ui.gauges import DecodeRate, GaugePanel, prefill_words


def stats(n_gen: int, t: float, *, rid: str = "r", final: bool = False, **kw) -> p.Stats:
    """A Stats as the engine sends it: decode_tok_s is the running average since the first token."""
    return p.Stats(id=rid, n_gen=n_gen, decode_tok_s=(n_gen - 1) / t, final=final, **kw)


def test_decode_rate_follows_a_slowdown_at_once():
    rate = DecodeRate(window_s=2.0)
    # 20 tok/s for 10 s, then 2 tok/s: the running average would still read ~17 after 2 s.
    n, t = 1, 0.0
    for _ in range(20):
        n, t = n + 10, t + 0.5
        rate.add(stats(n, t))
    for _ in range(4):
        n, t = n + 1, t + 0.5
        last = rate.add(stats(n, t))
    running = (n - 1) / t
    assert running > 15
    assert abs(last - 2.0) < 0.01


def test_decode_rate_starts_over_with_each_request():
    rate = DecodeRate()
    rate.add(stats(50, 1.0, rid="a"))
    assert rate.add(stats(2, 0.1, rid="b")) == 10.0  # one report: its own average
    assert rate.add(p.Stats(id="c", n_gen=1)) is None  # nothing written yet


def test_prefill_counts_only_the_tokens_processed():
    # 8 prompt tokens of which 7 were reused: one token read; a "2 tok/s" rate would mislead.
    words = prefill_words(p.Stats(id="r", n_prompt=8, n_reused=7, prefill_tok_s=2.0))
    assert "tok/s" not in words and "1 new token in 500 ms" in words and "7 reused" in words
    words = prefill_words(p.Stats(id="r", n_prompt=600, n_reused=88, prefill_tok_s=640.0))
    assert words.startswith("640 tok/s (512 new tokens") and "88 reused" in words


def test_gauges_show_the_recent_rate_then_the_request_average(qtbot):
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.on_stats(stats(41, 1.0))
    panel.on_stats(stats(45, 2.0))
    panel.on_stats(stats(47, 3.0))
    assert panel.decode.text() == "3.0 tok/s" and "last 2 s" in panel.decode_note.text()
    panel.on_stats(stats(47, 3.0, final=True))
    assert panel.decode.text() == f"{46 / 3.0:.1f} tok/s"
    assert panel.decode_note.text() == "average of this answer (47 tokens)"


def test_no_idle_prompt_bar(qtbot):
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.prefill_bar.isVisible()  # nothing is being read: no "prompt 0 / 1 tokens"
    panel.on_progress(p.Progress(id="r", phase="prefill", done=100, total=400))
    assert panel.prefill_bar.isVisible() and panel.prefill_bar.maximum() == 400
    panel.on_progress(p.Progress(id="r", phase="prefill", done=400, total=400))
    assert not panel.prefill_bar.isVisible()


def test_gauge_labels_never_overlap_in_a_short_panel(qtbot):
    """At a short window height the panel scrolls; its rows keep their own height."""
    from PySide6.QtCore import QRect

    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.on_loaded(p.Loaded(model="m", memory={"weights": 4 << 30, "kv": 1 << 30,
                                                 "compute": 1 << 29, "draft": 1 << 28}))
    panel.on_stats(stats(40, 1.0, n_prompt=100, prefill_tok_s=400, ttft_s=0.2))
    panel.resize(220, 160)
    panel.show()
    qtbot.waitExposed(panel)
    labels = [panel.mem_title, panel.legend, panel.decode, panel.decode_note, panel.prefill,
              panel.ttft, panel.accept, panel.draft_len]
    rects = [QRect(w.mapTo(panel.box, w.rect().topLeft()), w.size()) for w in labels if w.isVisible()]
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            assert not a.intersects(b), (a, b)
    assert panel.verticalScrollBar().maximum() > 0  # it scrolls instead of squeezing


def test_after_stop_the_decode_gauge_shows_the_answers_average_not_a_recent_rate(qtbot):
    """The engine sends no final report for a cancelled request: "1.5 tok/s · last 2 s" stayed."""
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.on_stats(stats(41, 1.0))
    panel.on_stats(stats(45, 3.0))
    assert "last 2 s" in panel.decode_note.text()
    panel.on_ended(p.Done(id="other", finish_reason="cancelled"))  # another request: no change
    assert "last 2 s" in panel.decode_note.text()
    panel.on_ended(p.Done(id="r", finish_reason="cancelled"))
    assert panel.decode.text() == f"{44 / 3.0:.1f} tok/s"
    assert panel.decode_note.text() == "average of this answer (45 tokens, stopped)"
    panel.on_stats(stats(3, 1.0, rid="s"))
    panel.on_ended(p.Error(kind="crash", message="the engine stopped", id="s"))
    assert panel.decode_note.text() == "average of this answer (3 tokens, failed)"


def test_the_window_ends_the_gauge_when_an_answer_is_stopped(qtbot, loaded_window):
    w = loaded_window
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.send("a long answer")
        qtbot.waitUntil(lambda: w.gauges.last_stats is not None, timeout=10000)
        w.stop()
    assert "last 2 s" not in w.gauges.decode_note.text()
