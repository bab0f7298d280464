"""The window's parts on their own: sidebar, header, composer (their signals and their room to grow)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QLabel, QPushButton

from ggufdesk.core.history import Conversation
from ggufdesk.engine.link import protocol as P
from ggufdesk.session import SaveState
from ggufdesk.session.models import ModelState


def conv(i: int, title: str) -> Conversation:
    return Conversation(id=i, title=title, created=0.0, updated=0.0)


def test_sidebar_says_what_was_asked_and_selecting_quietly_emits_nothing(qtbot):
    from ggufdesk.ui.sidebar import Sidebar

    bar = Sidebar()
    qtbot.addWidget(bar)
    bar.show()
    chosen: list[int] = []
    bar.conversation_chosen.connect(chosen.append)
    bar.set_conversations([conv(1, "one"), conv(2, "two")], select=2)
    assert chosen == []  # the window said which is open: nothing to announce
    bar.list.setCurrentIndex(bar.model.index(0))  # the user picks one
    assert chosen == [1]
    bar.conversation_changed(conv(3, "three"))
    assert bar.model.row_of(3) == 0
    bar.remove(3)
    assert bar.model.row_of(3) == -1
    asked: list[str] = []
    for name in ("new", "rename", "delete", "export"):
        getattr(bar, f"{name}_requested").connect(lambda n=name: asked.append(n))
        getattr(bar, f"{name}_btn").click()
    assert asked == ["new", "rename", "delete", "export"]
    with qtbot.waitSignal(bar.search_changed, timeout=3000) as searched:
        qtbot.keyClicks(bar.search, "tw")
    assert searched.args == ["tw"]


def test_header_shows_the_model_state_and_takes_a_switcher(qtbot):
    from ggufdesk.ui.header import Header

    head = Header()
    qtbot.addWidget(head)
    head.show()
    state = ModelState(phase="loaded", path="/m/a.gguf",
                       loaded=P.Loaded(model="/m/a.gguf", n_ctx=4096, load_s=1.0))
    head.set_model_state(state)
    assert head.model_label.text() == "a.gguf · 4096 ctx · CPU · loaded in 1.0 s"
    switcher = QComboBox()
    switcher.addItem("a.gguf")
    head.set_switcher(switcher)
    assert head.model_row.itemAt(0).widget() is switcher  # first in the model area
    assert head.model_label.text() == "4096 ctx · CPU · loaded in 1.0 s"  # the name is not said twice
    other = QComboBox()
    head.set_switcher(other)
    assert head.model_row.itemAt(0).widget() is other and head.model_row.count() == 2
    head.set_save_state(SaveState(status="retrying", reason="the disk is full"))
    assert head.save_label.isVisible()
    head.set_save_state(SaveState())
    assert not head.save_label.isVisible()


def test_composer_sends_the_text_as_typed_and_has_room_for_attachments(qtbot):
    from ggufdesk.ui.composer import Composer

    box = Composer()
    qtbot.addWidget(box)
    box.show()
    sent: list[str] = []
    box.send_requested.connect(sent.append)
    box.box.setFocus()
    qtbot.keyClicks(box.box, "hello")
    qtbot.keyClick(box.box, Qt.Key.Key_Return)
    box.send_btn.click()
    assert sent == ["hello", "hello"]  # clearing is the window's call (a refused send keeps it)
    box.set_busy(True)
    assert not box.send_btn.isEnabled() and box.stop_btn.isEnabled()
    stops: list[bool] = []
    box.stop_requested.connect(lambda: stops.append(True))
    box.stop_btn.click()
    assert stops == [True]
    assert not box._tool_row.isVisible() and not box._attach_row.isVisible()
    box.add_tool(QPushButton("Attach…"))
    chip = QLabel("photo.png ✕")
    box.add_attachment(chip)
    assert box._tool_row.isVisible() and box._attach_row.isVisible()
    box.remove_attachment(chip)
    assert not box._attach_row.isVisible()
    box.set_send_words("Continue", "The model continues your text", "Write the beginning")
    assert box.send_btn.text() == "Continue" and "Enter sends" in box.box.placeholderText()


def test_the_attach_buttons_say_less_when_the_window_is_narrow_and_all_when_it_is_wide(qtbot):
    """In an 800 px window "Attach image…", "Attach files…", "Attach folder…" were cut to "Attac…lder…"."""
    from PySide6.QtWidgets import QToolButton

    from ggufdesk.ui.composer import Composer

    box = Composer(images=True)
    qtbot.addWidget(box)
    files, folder = QToolButton(), QToolButton()
    files.setText("Attach files…")
    folder.setText("Attach folder…")
    box.add_tool(files)
    box.add_tool(folder)
    box.resize(900, 200)
    box.show()
    qtbot.waitUntil(lambda: files.text() == "Attach files…")
    assert box.attach_btn.text() == "Attach image…" and folder.text() == "Attach folder…"
    box.resize(300, 200)
    qtbot.waitUntil(lambda: files.text() == "Files…")
    assert box.attach_btn.text() == "Image…" and folder.text() == "Folder…"
    row = box._tool_row
    assert sum(w.sizeHint().width() for w in (box.attach_btn, files, folder)) <= row.width()
    box.resize(900, 200)
    qtbot.waitUntil(lambda: files.text() == "Attach files…")
    assert box.attach_btn.text() == "Attach image…"
