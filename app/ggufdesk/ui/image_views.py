"""Images in the window: thumbnails (with a remove button in the composer), a row of them in a message,
and what a paste or a drop carries (image data, or image files)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, QSize, Qt, Signal
from PySide6.QtGui import QImage, QImageReader, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from ggufdesk.core import images as img

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
FILE_FILTER = "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)"
COMPOSER_SIDE = 64  # thumbnails above the message box
MESSAGE_SIDE = 200  # images in a message


def pixmap(data: bytes, side: int) -> QPixmap:
    """The image scaled to fit side x side, turned as its EXIF orientation says; a null pixmap if Qt
    cannot read it (the engine's own checks come first)."""
    buf = QBuffer()
    buf.setData(QByteArray(data))
    buf.open(QIODevice.OpenModeFlag.ReadOnly)
    reader = QImageReader(buf)
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid() and max(size.width(), size.height()) > side * 2:
        reader.setScaledSize(size.scaled(QSize(side * 2, side * 2), Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        return QPixmap()
    return QPixmap.fromImage(image).scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                           Qt.TransformationMode.SmoothTransformation)


def png_bytes(image: QImage) -> bytes:
    """A pasted image (QImage) as PNG bytes."""
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    # PySide6 wants the format as str here (bytes is refused at run time); its stubs say bytes
    image.save(buf, "PNG")  # type: ignore[call-overload]
    return bytes(buf.data().data())


def read_image_file(path: str | Path) -> bytes:
    """An image file's bytes (at most images.MAX_BYTES + 1 read); OSError as KnownError by the caller."""
    with open(path, "rb") as f:
        return f.read(img.MAX_BYTES + 1)


def is_image_path(path: str) -> bool:
    return path.lower().endswith(IMAGE_SUFFIXES)


def mime_images(mime: QMimeData) -> list[bytes | str]:
    """What a paste or a drop carries as images: bytes of image files and of pasted pixels, or (str) the
    reason one could not be read. Empty when it carries none (then it is text)."""
    out: list[bytes | str] = []
    for url in mime.urls() if mime.hasUrls() else []:
        path = url.toLocalFile()
        if path and is_image_path(path):
            try:
                out.append(read_image_file(path))
            except OSError as e:
                out.append(f"could not read {Path(path).name}: {e.strerror or e}")
    if not out and mime.hasImage():
        image = mime.imageData()
        if isinstance(image, QImage) and not image.isNull():
            out.append(png_bytes(image))
    return out


class Thumbnail(QFrame):
    """One image, scaled to `side`; with `removable` a × button that emits `removed`."""

    removed = Signal()

    def __init__(self, data: bytes, *, side: int, removable: bool = False, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("thumbnail")
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.data = data
        self.picture = QLabel()
        self.picture.setObjectName("thumbnailPicture")
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        pix = pixmap(data, side)
        if pix.isNull():
            self.picture.setText("image")
        else:
            self.picture.setPixmap(pix)
        self.picture.setToolTip(self._describe())
        lay = QVBoxLayout(self) if not removable else QHBoxLayout(self)
        lay.setContentsMargins(2, 2, 2, 2)
        lay.setSpacing(0)
        lay.addWidget(self.picture)
        self.remove_btn: QToolButton | None = None
        if removable:
            self.remove_btn = QToolButton()
            self.remove_btn.setText("×")
            self.remove_btn.setAutoRaise(True)
            self.remove_btn.setToolTip("Remove this image")
            self.remove_btn.setAccessibleName("Remove image")
            self.remove_btn.clicked.connect(lambda: self.removed.emit())
            lay.addWidget(self.remove_btn, 0, Qt.AlignmentFlag.AlignTop)

    def _describe(self) -> str:
        try:
            fmt, w, h = img.check(self.data)
        except img.ImageError as e:
            return str(e)
        return f"{fmt} image, {w} x {h}, {len(self.data) / 1e6:.1f} MB"


class ImageRow(QWidget):
    """A message's images, side by side (missing ones said so)."""

    def __init__(self, images: list[bytes | None], *, side: int = MESSAGE_SIDE, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageImages")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 2, 0, 2)
        self.thumbnails: list[Thumbnail] = []
        for data in images:
            if data is None:
                gone = QLabel("(an image that is no longer in the history)")
                gone.setObjectName("missingImage")
                lay.addWidget(gone)
                continue
            t = Thumbnail(data, side=side)
            self.thumbnails.append(t)
            lay.addWidget(t)
        lay.addStretch(1)
