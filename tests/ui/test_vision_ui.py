"""Images in the window (over the fake engine): attach, paste and drop into the composer, thumbnails with a
remove button, the images shown in the conversation and stored with the history, and a text model that
takes none."""
from __future__ import annotations

from PySide6.QtCore import QMimeData, QUrl
from PySide6.QtGui import QImage

from ggufdesk.core import images as img
from tests.fixtures.vision import animated_gif, png_bytes


def load(qtbot, w, path):
    with qtbot.waitSignal(w.engine.loaded, timeout=15000):
        w.load_model(str(path))


def send_with(qtbot, w, text: str, images: list[bytes]) -> None:
    w.composer.attach(images)
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.input.setPlainText(text)
        assert w.send()


def test_attach_paste_drop_remove_and_send(qtbot, window, tmp_path):
    w = window
    load(qtbot, w, tmp_path / "tiny-vision-instruct.gguf")
    assert w.composer.attach_btn.isEnabled() and w.input.takes_images
    first, second = png_bytes(seed=1), png_bytes(seed=2)
    w.composer.attach([first])
    # a paste of pixels (a screenshot) and a drop of a file land in the same place
    pasted = QMimeData()
    pasted.setImageData(QImage(40, 30, QImage.Format.Format_RGB32))
    w.input.insertFromMimeData(pasted)
    f = tmp_path / "photo.png"
    f.write_bytes(second)
    dropped = QMimeData()
    dropped.setUrls([QUrl.fromLocalFile(str(f))])
    assert w.input.canInsertFromMimeData(dropped)
    w.input.insertFromMimeData(dropped)
    assert len(w.composer.thumbnails) == 3 and w.composer.images()[2] == second
    assert w.input.toPlainText() == ""  # images are not pasted as text
    w.composer.thumbnails[1].remove_btn.click()
    assert w.composer.images() == [first, second]
    with qtbot.waitSignal(w.answer_finished, timeout=15000):
        w.input.setPlainText("what are these")
        assert w.send()
    assert w.composer.images() == [] and not w.composer.thumbnails
    assert w.writer.flush(10)
    msgs = w.history.messages(w.conv.id)
    assert msgs[0].stats["images"] == [img.sha256(first), img.sha256(second)]
    assert w.history.images.get(img.sha256(first)) == first
    assert "[2 images] what are these" in msgs[1].content  # the fake engine saw both images
    shown = w.chat.widgets[0]
    assert shown.images_row is not None and len(shown.images_row.thumbnails) == 2
    # read back from the history: the images come from the data directory
    conv = w.conv
    w.new_conversation()
    with qtbot.waitSignal(w.conversation_loaded, timeout=10000):
        w.open_conversation(conv.id)
    assert len(w.chat.widgets[0].images_row.thumbnails) == 2


def test_a_bad_image_is_said_and_not_attached(qtbot, window, tmp_path):
    w = window
    load(qtbot, w, tmp_path / "tiny-vision-instruct.gguf")
    with qtbot.waitSignal(w.composer.image_refused, timeout=5000) as why:
        w.composer.attach([animated_gif()])
    assert "animation" in why.args[0] and not w.composer.thumbnails
    assert "animation" in w.banner.text


def test_a_text_model_takes_no_images(qtbot, window, tmp_path):
    w = window
    load(qtbot, w, tmp_path / "tiny-instruct.gguf")
    assert not w.composer.attach_btn.isEnabled() and not w.input.takes_images
    assert "reads text only" in w.composer.attach_btn.toolTip()
    pasted = QMimeData()
    pasted.setImageData(QImage(8, 8, QImage.Format.Format_RGB32))
    pasted.setText("plain words")
    w.input.insertFromMimeData(pasted)
    assert not w.composer.thumbnails and w.input.toPlainText() == "plain words"


def test_editing_a_message_attaches_its_images_again(qtbot, window, tmp_path):
    w = window
    load(qtbot, w, tmp_path / "tiny-vision-instruct.gguf")
    data = png_bytes(seed=4)
    send_with(qtbot, w, "look", [data])
    w.edit_message(w.session.turns[0].key)
    assert w.composer.images() == [data] and w.input.toPlainText() == "look"


def test_markdown_export_writes_the_images_beside_it(qtbot, window, tmp_path):
    w = window
    load(qtbot, w, tmp_path / "tiny-vision-instruct.gguf")
    data = png_bytes(seed=5)
    send_with(qtbot, w, "export me", [data])
    out = tmp_path / "chat.md"
    with qtbot.waitSignal(w.exported, timeout=10000):
        w.export_current(str(out))
    folder = tmp_path / "chat_images"
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].read_bytes() == data
    assert f"![image](chat_images/{files[0].name})" in out.read_text()


def test_the_wizards_download_fetches_the_projector_too(hub, tmp_path):
    from ggufdesk.ui.services import DownloadControl, ModelChoice, ModelServices
    from tests.fixtures.vision import write_tiny_vision_pair

    model, mmproj = write_tiny_vision_pair(tmp_path / "pair")
    hub.add_repo("org/w-GGUF", {"w-Q8_0.gguf": model, "mmproj-w-f16.gguf": mmproj})
    choice = ModelChoice(label="w", source="catalog", repo="org/w-GGUF", filename="w-Q8_0.gguf",
                         size_bytes=model.stat().st_size)
    path = ModelServices().download(choice, lambda done, total: None, DownloadControl())
    beside = path.parent / "mmproj-w-f16.gguf"
    assert beside.exists() and beside.read_bytes() == mmproj.read_bytes()
    assert ModelServices().choice_for_file(path, None).capabilities == ()  # (no hardware: not planned)
    assert "vision" in ModelServices().plan(ModelServices().choice_for_file(path, None), _hw()).capabilities


def _hw():
    from ggufdesk.core import hardware

    return hardware.probe()
