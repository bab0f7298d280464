"""Gauges, settings validation, Qt models (qtmodeltester), single instance."""
from __future__ import annotations

import os

from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.engine.link import protocol as p
from ggufdesk.ui.gauges import GaugePanel, SystemSample


def test_gauges_follow_engine_stats_during_a_stream(qtbot, loaded_window):
    w = loaded_window
    legend = w.gauges.legend.toolTip()
    assert "weights 4.0 KB" not in legend and "weights" in legend and "KV cache 64.0 MB" in legend
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.send("measure me")
    assert w.writer.flush(10)
    final = w.history.messages(w.conv.id)[1].stats
    # What the panel shows is what the engine's final stats said (the same numbers `run --json` prints).
    assert w.gauges.decode.text() == f"{final['decode_tok_s']:.1f} tok/s"
    assert w.gauges.ttft.text() == f"{final['ttft_s'] * 1000:.0f} ms"
    assert not w.gauges.prefill_bar.isVisible()  # no idle "prompt 0 / 1 tokens" bar after the answer
    assert w.gauges.decode_note.text() == f"average of this answer ({final['n_gen']} tokens)"
    assert len(w.gauges.graph.values) >= 2


def test_system_sampler_runs_off_the_gui_thread(qtbot, loaded_window):
    import threading

    w = loaded_window
    seen_threads = []
    import ggufdesk.ui.gauges as g

    real = g.sample_system
    g.sample_system = lambda pid: (seen_threads.append(threading.current_thread()), real(pid))[1]
    try:
        with qtbot.waitSignal(w.sampler.sampled, timeout=5000) as blocker:
            w.sampler._busy = False
            w.sampler.sample_now()
    finally:
        g.sample_system = real
    s = blocker.args[0]
    assert seen_threads and seen_threads[0] is not threading.main_thread()
    assert s.ram_total > 0 and s.engine_rss > 0  # the fake engine's own RSS
    assert "RAM" in w.gauges.mem_title.text()


def test_gauge_panel_draft_acceptance_and_vram(qtbot):
    panel = GaugePanel()
    qtbot.addWidget(panel)
    panel.on_loaded(p.Loaded(model="m", n_gpu_layers=-1,
                             memory={"weights": 4 << 30, "kv": 1 << 30, "compute": 1 << 29,
                                     "draft": 1 << 28}))
    panel.on_sample(SystemSample(ram_total=32 << 30, ram_used=8 << 30, gpu_name="RTX Test",
                                 vram_total=24 << 30, vram_used=8 << 30))
    assert "VRAM (RTX Test)" in panel.mem_title.text()
    assert "other processes 2.2 GB" in panel.legend.toolTip()  # 8 GB used - 5.75 GB ours
    panel.on_stats(p.Stats(id="r", n_prompt=100, n_gen=40, ttft_s=0.25, prefill_tok_s=400,
                           decode_tok_s=55.5, drafted=40, accepted=30, draft_len=6,
                           speculation="draft"))
    assert panel.accept.text() == "75% (30/40, draft)" and panel.draft_len.text() == "6"
    assert panel.decode.text() == "55.5 tok/s" and panel.ttft.text() == "250 ms"
    panel.on_progress(p.Progress(id="r", phase="prefill", done=50, total=200))
    assert (panel.prefill_bar.value(), panel.prefill_bar.maximum()) == (50, 200)
    panel.graph.add(10)
    panel.graph.add(20)
    assert not panel.graph.grab().isNull()  # paints without errors
    assert not panel.bar.grab().isNull()


def test_settings_dialog_validates_through_core_settings(qtbot):
    from PySide6.QtWidgets import QDialogButtonBox

    from ggufdesk.ui.settings_dialog import SettingsDialog

    rec = (LoadSettings(n_ctx=8192, n_gpu_layers=20), SpeculationSettings(mode="lookup"))
    dlg = SettingsDialog(LoadSettings(), SpeculationSettings(), recommended=lambda: rec)
    qtbot.addWidget(dlg)
    ok = dlg.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert ok.isEnabled() and dlg.error_label.text() == ""
    dlg.w["n_batch"].setValue(256)
    dlg.w["n_ubatch"].setValue(512)
    assert not ok.isEnabled()
    assert "cannot be larger than the batch" in dlg.error_label.text()
    dlg.w["n_ubatch"].setValue(128)
    assert ok.isEnabled()
    dlg.w["flash_attn"].setCurrentText("off")
    dlg.w["type_v"].setCurrentText("q8_0")
    assert "needs flash attention" in dlg.error_label.text() and not ok.isEnabled()
    dlg.w["flash_attn"].setCurrentText("on")
    dlg.w["mode"].setCurrentText("draft")
    assert "needs a draft model" in dlg.error_label.text()
    dlg.w["draft_model"].setText("/models/small.gguf")
    dlg.w["k_min"].setValue(9)
    dlg.w["k_max"].setValue(4)
    assert "K min (9) cannot exceed K max (4)" in dlg.error_label.text()
    dlg.reset_to_recommended()
    load, spec = dlg.values()
    assert (load.n_ctx, load.n_gpu_layers, spec.mode) == (8192, 20, "lookup")
    assert ok.isEnabled()


def test_settings_dialog_every_field_has_an_explanation(qtbot):
    from ggufdesk.ui.settings_dialog import HELP, SettingsDialog

    dlg = SettingsDialog(LoadSettings(), SpeculationSettings())
    qtbot.addWidget(dlg)
    assert set(dlg.w) <= set(HELP)
    assert all(len(h[1]) > 20 for h in HELP.values())


def test_conversation_dialog_sampling(qtbot):
    from ggufdesk.core.settings import SamplingSettings
    from ggufdesk.ui.conversation_dialog import ConversationDialog

    dlg = ConversationDialog(system_prompt="hi", sampling=SamplingSettings(temperature=0.3),
                             mode="completion")
    qtbot.addWidget(dlg)
    dlg.temperature.setValue(0.0)
    dlg.max_tokens.setValue(64)
    s = dlg.sampling()
    assert (s.temperature, s.max_tokens) == (0.0, 64) and dlg.mode.currentText() == "completion"


def test_conversation_list_model(qtmodeltester, history):
    from ggufdesk.ui.conversation_model import IdRole, ConversationListModel

    m = ConversationListModel()
    for t in ("a", "b", "c"):
        history.new_conversation(t)
    m.set_conversations(history.list_conversations())
    qtmodeltester.check(m, force_py=True)
    conv = history.new_conversation("d")
    m.update(conv)
    m.remove(m.conversation(1).id)
    qtmodeltester.check(m, force_py=True)
    assert [m.data(m.index(i)) for i in range(m.rowCount())] == ["d", "b", "a"]
    assert m.data(m.index(0), IdRole) == conv.id


def test_choice_table_model(qtmodeltester, tmp_path):
    from ggufdesk.ui.choice_model import ChoiceTableModel
    from ggufdesk.ui.services import ModelChoice

    m = ChoiceTableModel()
    m.set_rows([ModelChoice(label="x", source="catalog", size_bytes=1 << 30, fit="full_gpu",
                            n_gpu_layers=-1, pred_decode_tok_s=80, recommended=True),
                ModelChoice(label="y", source="file", path=tmp_path, fit="too_large")])
    qtmodeltester.check(m, force_py=True)
    m.add(ModelChoice(label="z", source="disk"))
    qtmodeltester.check(m, force_py=True)
    assert m.data(m.index(0, 0)) == "★ x" and m.data(m.index(0, 3)) == "fits on the GPU"
    assert m.data(m.index(0, 4)) == "all" and m.data(m.index(0, 6)) == "~80 tok/s"
    m = ChoiceTableModel()  # (a fresh one: the tester watches the first)
    m.set_rows([ModelChoice(label="moe", source="catalog", capabilities=("moe", "reasoning", "tools"),
                            fit="partial", n_gpu_layers=49, n_cpu_moe=20)])
    assert m.data(m.index(0, 1)) == "reasons · tools · MoE"
    assert m.data(m.index(0, 4)) == "49, experts of 20 on the CPU"


def test_single_instance_raises_the_first_window(qtbot):
    from ggufdesk.ui.app import SingleInstance

    name = f"ggufdesk-test-{os.getpid()}"
    first = SingleInstance(name)
    raised = []
    assert first.listen(lambda: raised.append(True))
    second = SingleInstance(name)
    assert second.another_is_running()
    qtbot.waitUntil(lambda: bool(raised), timeout=3000)
    first.server.close()
    assert not SingleInstance(name + "-none").another_is_running()


def test_window_geometry_is_remembered(qtbot, bridge, history, tmp_path):
    from PySide6.QtCore import QSettings

    from ggufdesk.ui.main_window import MainWindow

    qs = QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat)
    w1 = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w1)
    w1.resize(771, 533)
    w1.save_geometry(qs)
    w2 = MainWindow(engine=bridge, history=history, persist_settings=False)
    qtbot.addWidget(w2)
    w2.restore_geometry(QSettings(str(tmp_path / "ui.ini"), QSettings.Format.IniFormat))
    assert (w2.width(), w2.height()) == (771, 533)


def test_single_instance_is_per_user_and_display():
    from ggufdesk.ui.app import SERVER_NAME, SingleInstance, instance_name

    a = instance_name({"DISPLAY": ":0"})
    assert a.startswith(SERVER_NAME + "-") and a != SERVER_NAME
    assert a == instance_name({"DISPLAY": ":0"})
    assert a != instance_name({"DISPLAY": ":1"})
    assert instance_name({"WAYLAND_DISPLAY": "wayland-0"}) != instance_name({"DISPLAY": ":0"})
    assert SingleInstance().name == instance_name()


def test_a_reasoning_answer_shows_its_thinking_folded_above_it(qtbot):
    from ggufdesk.ui.message_widget import MessageWidget, thinking_title

    w = MessageWidget(message_id=1, role="assistant", text="", status="streaming")
    qtbot.addWidget(w)
    assert not w.thinking.isVisibleTo(w)
    w.think({"reasoning": "Two and two", "reasoning_tokens": 3, "reasoning_s": 1.5})
    assert w.thinking.isVisibleTo(w) and not w.thinking.text.isVisibleTo(w)  # folded while it streams
    assert w.thinking.toggle.text() == "Thinking… · 3 tokens · 1.5 s"
    w.thinking.toggle.click()
    assert w.thinking.text.isVisibleTo(w) and w.thinking.text.text() == "Two and two"
    w.append("It is 4.")
    w.set_status("done")
    w.set_stats({"reasoning": "Two and two make four.", "reasoning_tokens": 6, "reasoning_s": 4.0,
                 "finish_reason": "stop"})
    assert w.thinking.toggle.text() == "Thought for 4.0 s · 6 tokens"
    assert w.text == "It is 4."  # the copy is the answer alone
    assert thinking_title({}, streaming=True) == "Thinking…"
    plain = MessageWidget(message_id=2, role="assistant", text="hi", stats={"finish_reason": "stop"})
    qtbot.addWidget(plain)
    assert not plain.thinking.isVisibleTo(plain)


def test_the_gauges_count_thinking_apart(qtbot):
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.ui.gauges import GaugePanel

    g = GaugePanel()
    qtbot.addWidget(g)
    g.on_stats(P.Stats(id="r1", n_gen=10, decode_tok_s=5.0, final=True))
    g.on_done(P.Done(id="r1", finish_reason="stop", usage={"completion_tokens": 10, "reasoning_tokens": 7}))
    assert g.decode_note.text() == "average of this answer (10 tokens: 7 thinking, 3 answering)"


def test_merged_tokens_keep_thinking_and_answer_apart(qtbot):
    from ggufdesk.engine.link import protocol as P
    from ggufdesk.ui.engine_adapter import EngineBridge

    got = []
    b = EngineBridge.__new__(EngineBridge)
    b._queue, b._woken = [P.Token(id="r", text="a", reasoning=True), P.Token(id="r", text="b", reasoning=True),
                          P.Token(id="r", text="c")], True
    import threading

    b._lock = threading.Lock()
    b._dispatch = got.append
    b._drain()
    assert [(t.text, t.reasoning) for t in got] == [("ab", True), ("c", False)]
