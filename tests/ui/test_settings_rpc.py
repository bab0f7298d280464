"""The engine settings' Remote workers list: one host:port per line, checked as it is typed."""
from __future__ import annotations

from ggufdesk.core.settings import LoadSettings, SpeculationSettings


def test_remote_workers_round_trip_and_bad_entries_block_ok(qtbot):
    from PySide6.QtWidgets import QDialogButtonBox

    from ggufdesk.ui.settings_dialog import SettingsDialog

    dlg = SettingsDialog(LoadSettings(rpc=["10.0.0.2:50052"]), SpeculationSettings())
    qtbot.addWidget(dlg)
    ok = dlg.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert dlg.rpc_edit.toPlainText() == "10.0.0.2:50052" and ok.isEnabled()
    dlg.rpc_edit.setPlainText("10.0.0.2:50052\nbox.lan")
    assert not ok.isEnabled() and "host:port" in dlg.error_label.text()
    dlg.rpc_edit.setPlainText("10.0.0.2:50052\n\nbox.lan:50053\n")
    assert ok.isEnabled()
    assert dlg.values()[0].rpc == ["10.0.0.2:50052", "box.lan:50053"]
    dlg.rpc_edit.setPlainText("")
    assert dlg.values()[0].rpc == []
