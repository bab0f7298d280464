"""Live gauges: memory breakdown bar, decode/prefill speed, TTFT, draft acceptance, tok/s graph."""
from __future__ import annotations

import collections
import dataclasses
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from PySide6.QtCore import QEvent, QObject, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import (
    QFormLayout, QFrame, QGroupBox, QLabel, QProgressBar, QScrollArea, QSizePolicy, QVBoxLayout,
    QWidget,
)

from ggufdesk.engine.link import protocol as p
from ggufdesk.ui import theme
from ggufdesk.ui.tasks import run_in_background

log = logging.getLogger("ggufdesk.ui.gauges")

SEGMENTS = (  # key, label; colours are the palette's chart series (theme.series)
    ("weights", "weights"),
    ("kv", "KV cache"),
    ("compute", "compute"),
    ("draft", "draft"),
    ("projector", "vision projector"),
    ("other", "other processes"),
)
RATE_WINDOW_S = 2.0  # the decode gauge shows the speed over the last 2 s of writing
MIN_RATE_TOKENS = 16  # fewer new prompt tokens than this: show the time, not a rate


def segment_colour(key: str) -> QColor:
    if key == "other":
        return theme.muted()
    return theme.series([k for k, _ in SEGMENTS].index(key))


class DecodeRate:
    """Decode tok/s over a recent window, from the engine's own clock.

    Each Stats carries the request's running average `(n_gen - 1) / t` since the first token, so
    `t` is known exactly at every report; two reports a window apart give the recent speed, which
    drops at once when writing slows (a running average would hide it for a long time).
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.rid: str | None = None
        self.points: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, ev: p.Stats) -> float | None:
        """The recent rate after this report, or None while too little has been written."""
        if ev.id != self.rid:
            self.rid = ev.id
            self.points.clear()
        if ev.n_gen < 2 or ev.decode_tok_s <= 0:
            return None
        t = (ev.n_gen - 1) / ev.decode_tok_s  # seconds since the first token, engine clock
        self.points.append((t, ev.n_gen))
        while len(self.points) > 2 and t - self.points[1][0] >= self.window_s:
            self.points.popleft()
        t0, n0 = self.points[0]
        if len(self.points) < 2 or t <= t0:
            return ev.decode_tok_s
        return (ev.n_gen - n0) / (t - t0)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


@dataclass(slots=True)
class SystemSample:
    ram_total: int = 0
    ram_used: int = 0
    engine_rss: int = 0
    gpu_name: str = ""
    vram_total: int = 0
    vram_used: int = 0
    notes: list[str] = field(default_factory=list)


def sample_system(engine_pid: int | None) -> SystemSample:
    """psutil + NVML; called on a worker thread, never on the GUI thread."""
    import psutil

    vm = psutil.virtual_memory()
    s = SystemSample(ram_total=vm.total, ram_used=vm.total - vm.available)
    if engine_pid:
        try:
            s.engine_rss = psutil.Process(engine_pid).memory_info().rss
        except (psutil.Error, OSError):
            s.engine_rss = 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() > 0:
                h = pynvml.nvmlDeviceGetHandleByIndex(0)
                info = pynvml.nvmlDeviceGetMemoryInfo(h)
                name = pynvml.nvmlDeviceGetName(h)
                s.gpu_name = name.decode() if isinstance(name, bytes) else str(name)
                s.vram_total, s.vram_used = int(info.total), int(info.used)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVIDIA driver: a CPU-only machine, RAM it is
        pass
    return s


class SystemSampler(QObject):
    """Samples memory every `interval_ms` on a worker thread; at most one sample in flight."""

    sampled = Signal(object)  # SystemSample

    def __init__(self, pid_getter: Callable[[], int | None], *, interval_ms: int = 1000,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pid = pid_getter
        self._busy = False
        self.timer = QTimer(self, interval=interval_ms)
        self.timer.timeout.connect(self.sample_now)

    def start(self) -> None:
        self.sample_now()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def sample_now(self) -> None:
        if self._busy:
            return
        self._busy = True
        pid = self._pid()

        def done(fut: Future[SystemSample]) -> None:
            self._busy = False
            if fut.exception() is None:
                self.sampled.emit(fut.result())
            else:
                log.warning("memory sampling failed: %s", fut.exception())

        run_in_background(lambda: sample_system(pid), done)


class MemoryBar(QWidget):
    """A stacked bar: each part of the model's memory, what others use, and what is free."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.total = 0
        self.parts: dict[str, int] = {}
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_parts(self, total: int, parts: dict[str, int]) -> None:
        self.total, self.parts = total, dict(parts)
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt API
        qp = QPainter(self)
        qp.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        pal = self.palette()
        qp.setPen(QPen(pal.color(QPalette.ColorRole.Mid)))
        qp.setBrush(pal.color(QPalette.ColorRole.Base))
        qp.drawRoundedRect(r, 4, 4)
        if self.total <= 0:
            return
        x = r.left()
        qp.setPen(Qt.PenStyle.NoPen)
        for key, _ in SEGMENTS:
            w = r.width() * min(1.0, self.parts.get(key, 0) / self.total)
            w = min(w, r.right() - x)
            if w > 0:
                qp.setBrush(segment_colour(key))
                qp.drawRect(QRectF(x, r.top() + 1, w, r.height() - 2))
                x += w


class RateGraph(QWidget):
    """The last `n` decode tok/s readings as a line."""

    def __init__(self, n: int = 120, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.values: collections.deque[float] = collections.deque(maxlen=n)
        self.setMinimumHeight(60)

    def add(self, value: float) -> None:
        self.values.append(max(0.0, value))
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt API
        qp = QPainter(self)
        qp.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        pal = self.palette()
        qp.setPen(QPen(pal.color(QPalette.ColorRole.Mid)))
        qp.setBrush(pal.color(QPalette.ColorRole.Base))
        qp.drawRect(r)
        if len(self.values) < 2:
            qp.setPen(theme.muted(pal))
            qp.drawText(r, Qt.AlignmentFlag.AlignCenter, "tok/s history")
            return
        top = max(self.values) * 1.15 or 1.0
        step = r.width() / ((self.values.maxlen or len(self.values)) - 1)
        x0 = r.right() - step * (len(self.values) - 1)
        path = QPainterPath()
        for i, v in enumerate(self.values):
            pt = QPointF(x0 + i * step, r.bottom() - (v / top) * (r.height() - 4))
            path.moveTo(pt) if i == 0 else path.lineTo(pt)
        qp.setPen(QPen(theme.series(0, pal), 1.6))
        qp.setBrush(Qt.BrushStyle.NoBrush)
        qp.drawPath(path)
        qp.setPen(theme.muted(pal))
        qp.drawText(r.adjusted(4, 2, -4, -2), Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft,
                    f"{max(self.values):.0f} tok/s peak")


def _legend(key_colour: QColor, text: str, mark: str = "■") -> str:
    text = text.replace(" ", "&nbsp;")
    return f"<span style='color:{theme.css(key_colour)}'>{mark}</span>&nbsp;{text}"


class GaugePanel(QScrollArea):
    """Everything the engine and the system report, updated live; scrolls when the window is short."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.box = QGroupBox("Live")
        self.box.setMinimumWidth(180)
        self.memory: dict[str, int] = {}
        self.n_gpu_layers = 0
        self.sample = SystemSample()
        self.rate = DecodeRate()
        self.mem_title = QLabel("Memory")
        self.mem_title.setWordWrap(True)
        self.bar = MemoryBar()
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.decode_title = QLabel("Decode")
        # Above the form, across the panel: beside its label, the 20 px figure wrapped "86.6 tok/" over "s"
        self.decode = QLabel("–")
        self.decode_note = QLabel("")
        self.decode_note.setWordWrap(True)
        self.prefill = QLabel("–")
        self.prefill.setWordWrap(True)
        self.prefill_bar = QProgressBar()
        self.prefill_bar.setRange(0, 1)
        self.prefill_bar.setValue(0)
        self.prefill_bar.setTextVisible(True)
        self.prefill_bar.setFormat("prompt %v / %m tokens")
        self.prefill_bar.setVisible(False)  # only while a prompt is being read
        self.ttft = QLabel("–")
        self.accept = QLabel("–")
        self.accept.setWordWrap(True)
        self.draft_len = QLabel("–")
        self.graph = RateGraph()
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.addRow("Prefill", self.prefill)
        form.addRow(self.prefill_bar)
        form.addRow("First token", self.ttft)
        form.addRow("Draft accepted", self.accept)
        form.addRow("Draft length", self.draft_len)
        lay = QVBoxLayout(self.box)
        lay.addWidget(self.mem_title)
        lay.addWidget(self.bar)
        lay.addWidget(self.legend)
        lay.addSpacing(4)
        lay.addWidget(self.decode_title)
        lay.addWidget(self.decode)
        lay.addWidget(self.decode_note)
        lay.addLayout(form)
        lay.addWidget(self.graph)
        lay.addStretch(1)
        self.setWidget(self.box)
        # Never narrower than the box (the splitter folds it away instead of cutting it off).
        self.setMinimumWidth(self.box.minimumWidth() + self.verticalScrollBar().sizeHint().width())
        self.last_stats: p.Stats | None = None
        self._restyle()
        self._refresh_memory()

    def _restyle(self) -> None:
        theme.restyle(self.mem_title, "font-weight: 600;")
        theme.restyle(self.decode_title, "font-weight: 600;")
        theme.restyle(self.decode, "font-size: 20px; font-weight: 600;")
        theme.restyle(self.decode_note, f"color: {theme.css(theme.muted())};")

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt API
        super().changeEvent(event)
        if event.type() in theme.PALETTE_EVENTS:  # a child gets PaletteChange, a window the other
            self._restyle()
            self._refresh_memory()

    # ---- engine events ------------------------------------------------------------------------

    def on_loaded(self, ev: p.Loaded) -> None:
        self.memory = {k: int(v) for k, v in ev.memory.items()}
        self.n_gpu_layers = ev.n_gpu_layers
        self._refresh_memory()

    def on_unloaded(self) -> None:
        self.memory = {}
        self.n_gpu_layers = 0
        self._refresh_memory()

    def on_progress(self, ev: p.Progress) -> None:
        if ev.total <= 0 or ev.done >= ev.total:
            self.prefill_bar.setVisible(False)
            return
        self.prefill_bar.setRange(0, ev.total)
        self.prefill_bar.setValue(ev.done)
        self.prefill_bar.setVisible(True)

    def on_done(self, ev: p.Done) -> None:
        """A reasoning model's answer: its thinking counted apart from the answer's tokens."""
        n = ev.usage.get("reasoning_tokens")
        done = ev.usage.get("completion_tokens", 0)
        if n is not None and done > 1 and self.last_stats is not None and self.last_stats.final:
            self.decode_note.setText(f"average of this answer ({done} tokens: {n} thinking, "
                                     f"{done - n} answering)")

    def on_stats(self, ev: p.Stats) -> None:
        self.last_stats = ev
        recent = self.rate.add(ev)
        if ev.final:
            self.decode.setText(f"{ev.decode_tok_s:.1f} tok/s" if ev.n_gen > 1 else "–")
            self.decode_note.setText(f"average of this answer ({ev.n_gen} tokens)"
                                     if ev.n_gen > 1 else "")
        elif recent is not None and ev.threads:
            self.decode.setText(f"{recent:.1f} tok/s")
            self.decode_note.setText(f"last {self.rate.window_s:.0f} s, {ev.threads} thread"
                                     + ("s" if ev.threads > 1 else ""))
        elif recent is not None:
            self.decode.setText(f"{recent:.1f} tok/s")
            self.decode_note.setText(f"last {self.rate.window_s:.0f} s")
        else:
            self.decode.setText("…")
            self.decode_note.setText("")
        self.prefill.setText(prefill_words(ev))
        self.prefill_bar.setVisible(False)  # stats come after the prompt has been read
        self.ttft.setText(f"{ev.ttft_s * 1000:.0f} ms")
        if ev.speculation in ("draft", "lookup") and ev.drafted:
            self.accept.setText(f"{100 * ev.accepted / ev.drafted:.0f}% "
                                f"({ev.accepted}/{ev.drafted}, {ev.speculation})")
            self.draft_len.setText(str(ev.draft_len))
        else:
            self.accept.setText(ev.speculation if ev.speculation != "off" else "off")
            self.draft_len.setText("–")
        if recent is not None and not ev.final:
            self.graph.add(recent)

    def on_ended(self, ev: p.Done | p.Error) -> None:
        """A request ended without a final report (stopped, failed, the engine died): the decode
        gauge shows what the answer averaged, not a "last 2 s" rate that is no longer true."""
        last = self.last_stats
        if last is None or last.final or ev.id is None or ev.id != last.id:
            return
        why = "stopped" if isinstance(ev, p.Done) else "failed"
        if last.n_gen > 1 and last.decode_tok_s > 0:
            self.decode.setText(f"{last.decode_tok_s:.1f} tok/s")
            self.decode_note.setText(f"average of this answer ({last.n_gen} tokens, {why})")
        else:
            self.decode.setText("–")
            self.decode_note.setText(why)
        self.last_stats = dataclasses.replace(last, final=True)

    def on_sample(self, s: SystemSample) -> None:
        self.sample = s
        self._refresh_memory()

    # ---- memory -------------------------------------------------------------------------------

    def _refresh_memory(self) -> None:
        s = self.sample
        ours = sum(self.memory.get(k, 0) for k in ("weights", "kv", "compute", "draft", "projector"))
        on_gpu = s.vram_total > 0 and self.n_gpu_layers != 0
        if on_gpu:
            total, used, where = s.vram_total, s.vram_used, f"VRAM ({s.gpu_name})"
            other = max(0, used - ours)
        else:
            total, used, where = s.ram_total, s.ram_used, "RAM"
            # Everything in use that is not our engine (its RSS covers weights it touched + buffers).
            other = max(0, used - max(s.engine_rss, 0))
        parts = dict(self.memory)
        parts["other"] = other
        self.mem_title.setText(f"Memory · {where}")
        self.bar.set_parts(total, parts)
        items = [_legend(segment_colour(k), f"{label} {human_bytes(parts.get(k, 0))}")
                 for k, label in SEGMENTS if parts.get(k, 0) or k in ("weights", "other")]
        free = max(0, total - ours - other)
        items.append(_legend(theme.muted(), f"free {human_bytes(free)} of {human_bytes(total)}",
                             mark="□"))  # free is the bar's empty part: an outline
        # A space between items lets the legend wrap onto more lines instead of overlapping.
        self.legend.setText(" ".join(items))
        self.legend.setToolTip(self.legend.text().replace("&nbsp;", " "))


def prefill_words(ev: p.Stats) -> str:
    """How fast the prompt was read, counting only the tokens actually processed."""
    new = max(0, ev.n_prompt - ev.n_reused)
    reused = f"; {ev.n_reused} reused from before" if ev.n_reused else ""
    if new >= MIN_RATE_TOKENS and ev.prefill_tok_s > 0:
        return f"{ev.prefill_tok_s:.0f} tok/s ({new} new tokens{reused})"
    if new and ev.prefill_tok_s > 0:
        return f"{new} new token{'s' if new != 1 else ''} in {1000 * new / ev.prefill_tok_s:.0f} ms{reused}"
    return f"nothing new to read{reused}" if ev.n_reused else "–"
