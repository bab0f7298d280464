"""End to end: the chat window over the real engine on a tiny synthetic model."""
from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")


def test_chat_with_the_real_engine_on_a_tiny_model(qtbot, history, tiny_model):
    from ggufdesk.core.settings import LoadSettings, SamplingSettings
    from ggufdesk.ui.engine_adapter import EngineBridge
    from ggufdesk.ui.main_window import MainWindow

    engine = EngineBridge()  # the real worker: python -m ggufdesk.engine.runtime.worker
    w = MainWindow(engine=engine, history=history, persist_settings=False)
    qtbot.addWidget(w)
    w.show()
    try:
        with qtbot.waitSignal(engine.loaded, timeout=60000) as loaded:
            w.load_model(str(tiny_model), LoadSettings(n_ctx=256, n_threads=1, n_threads_batch=1))
        assert loaded.args[0].chat_format == "completion"  # no template: completion mode
        conv = w.new_conversation()
        assert conv.mode == "completion"
        w.session.update_conversation(sampling=SamplingSettings(temperature=0, max_tokens=24))
        with qtbot.waitSignal(w.answer_finished, timeout=60000) as done:
            assert w.send("the cat and the dog")
        assert done.args == ["done"]
        assert w.writer.flush(10)
        user, answer = w.history.messages(w.conv.id)
        assert user.content == "the cat and the dog"
        assert answer.status == "done" and answer.content.strip()
        assert answer.stats["n_gen"] > 0 and answer.stats["final"]
        assert w.gauges.last_stats is not None and w.gauges.last_stats.final
        assert w.gauges.legend.text().count("weights") == 1
    finally:
        engine.shutdown()
