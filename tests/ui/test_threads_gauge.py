"""The speed gauge tells how many CPU threads decode now (engine/batching/threads.py adapts them)."""
from __future__ import annotations

from ggufdesk.ui.gauges import GaugePanel
from tests.ui.test_honest_gauges import stats


def test_the_decode_note_shows_the_thread_count_while_decoding(qtbot):
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.on_stats(stats(41, 1.0, threads=2))
    panel.on_stats(stats(45, 2.0, threads=1))
    assert panel.decode_note.text() == "last 2 s, 1 thread"
    panel.on_stats(stats(47, 3.0, threads=0))  # an engine that does not tell: as before
    assert panel.decode_note.text() == "last 2 s"


def test_the_speed_figure_is_never_broken_over_two_lines_in_a_narrow_panel(qtbot):
    """At 20 px a figure beside its label wrapped "86.6 tok/" over "s" in the window's default
    panel: it sits on its own line across the panel, unwrapped."""
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.resize(panel.minimumWidth(), 600)
    panel.show()
    panel.on_stats(stats(41, 1.0, threads=2))
    panel.on_stats(stats(300, 2.0, threads=2))
    qtbot.waitUntil(lambda: panel.decode.text().endswith("tok/s"))
    assert not panel.decode.wordWrap()
    one_line = panel.decode.fontMetrics().height()
    assert panel.decode.height() < 2 * one_line
    assert panel.decode.width() >= panel.decode.fontMetrics().horizontalAdvance(panel.decode.text())
