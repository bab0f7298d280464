"""Live gauges: memory breakdown bar, decode/prefill speed, TTFT, draft acceptance, tok/s graph."""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QFormLayout, QGroupBox, QLabel, QProgressBar, QSizePolicy, QVBoxLayout, QWidget,
)

from ggufdesk.engine import protocol as p
from ggufdesk.ui.tasks import run_in_background

log = logging.getLogger("ggufdesk.ui.gauges")

SEGMENTS = (  # key, label, colour
    ("weights", "weights", "#3b7dd8"),
    ("kv", "KV cache", "#36a773"),
    ("compute", "compute", "#e3a33b"),
    ("draft", "draft", "#9b59b6"),
    ("other", "other processes", "#9aa5b1"),
)


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

    def __init__(self, pid_getter, *, interval_ms: int = 1000, parent: QObject | None = None) -> None:
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

        def done(fut) -> None:
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

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt API
        qp = QPainter(self)
        qp.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        qp.setPen(QPen(QColor("#c5ccd4")))
        qp.setBrush(QColor("#eef1f4"))
        qp.drawRoundedRect(r, 4, 4)
        if self.total <= 0:
            return
        x = r.left()
        qp.setPen(Qt.PenStyle.NoPen)
        for key, _, colour in SEGMENTS:
            w = r.width() * min(1.0, self.parts.get(key, 0) / self.total)
            w = min(w, r.right() - x)
            if w > 0:
                qp.setBrush(QColor(colour))
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

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt API
        qp = QPainter(self)
        qp.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(1, 1, -1, -1)
        qp.setPen(QPen(QColor("#d5dbe1")))
        qp.setBrush(QColor("#fbfcfd"))
        qp.drawRect(r)
        if len(self.values) < 2:
            qp.setPen(QColor("#8a96a3"))
            qp.drawText(r, Qt.AlignmentFlag.AlignCenter, "tok/s history")
            return
        top = max(self.values) * 1.15 or 1.0
        step = r.width() / (self.values.maxlen - 1)
        x0 = r.right() - step * (len(self.values) - 1)
        path = QPainterPath()
        for i, v in enumerate(self.values):
            pt = QPointF(x0 + i * step, r.bottom() - (v / top) * (r.height() - 4))
            path.moveTo(pt) if i == 0 else path.lineTo(pt)
        qp.setPen(QPen(QColor("#3b7dd8"), 1.6))
        qp.setBrush(Qt.BrushStyle.NoBrush)
        qp.drawPath(path)
        qp.setPen(QColor("#5b6875"))
        qp.drawText(r.adjusted(4, 2, -4, -2), Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft,
                    f"{max(self.values):.0f} tok/s peak")


def _legend(key_colour: str, text: str) -> str:
    text = text.replace(" ", "&nbsp;")
    return f"<span style='color:{key_colour}'>■</span>&nbsp;{text}"


class GaugePanel(QGroupBox):
    """Everything the engine and the system report, updated live."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Live", parent)
        self.memory: dict[str, int] = {}
        self.n_gpu_layers = 0
        self.sample = SystemSample()
        self.mem_title = QLabel("Memory")
        self.mem_title.setStyleSheet("font-weight: 600;")
        self.bar = MemoryBar()
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.decode = QLabel("–")
        self.decode.setStyleSheet("font-size: 20px; font-weight: 600;")
        self.prefill = QLabel("–")
        self.prefill_bar = QProgressBar()
        self.prefill_bar.setRange(0, 1)
        self.prefill_bar.setValue(0)
        self.prefill_bar.setTextVisible(True)
        self.prefill_bar.setFormat("prompt %v / %m tokens")
        self.ttft = QLabel("–")
        self.accept = QLabel("–")
        self.draft_len = QLabel("–")
        self.graph = RateGraph()
        form = QFormLayout()
        form.addRow("Decode", self.decode)
        form.addRow("Prefill", self.prefill)
        form.addRow("", self.prefill_bar)
        form.addRow("First token", self.ttft)
        form.addRow("Draft accepted", self.accept)
        form.addRow("Draft length", self.draft_len)
        lay = QVBoxLayout(self)
        lay.addWidget(self.mem_title)
        lay.addWidget(self.bar)
        lay.addWidget(self.legend)
        lay.addLayout(form)
        lay.addWidget(self.graph)
        lay.addStretch(1)
        self.last_stats: p.Stats | None = None
        self._refresh_memory()

    # ---- engine events ------------------------------------------------------------------------

    def on_loaded(self, ev: p.Loaded) -> None:
        self.memory = {k: int(v) for k, v in ev.memory.items()}
        self.n_gpu_layers = ev.n_gpu_layers
        self._refresh_memory()

    def on_unloaded(self) -> None:
        self.memory = {}
        self._refresh_memory()

    def on_progress(self, ev: p.Progress) -> None:
        self.prefill_bar.setRange(0, max(1, ev.total))
        self.prefill_bar.setValue(ev.done)

    def on_stats(self, ev: p.Stats) -> None:
        self.last_stats = ev
        self.decode.setText(f"{ev.decode_tok_s:.1f} tok/s" if ev.n_gen > 1 else "…")
        reused = f", {ev.n_reused} reused" if ev.n_reused else ""
        self.prefill.setText(f"{ev.prefill_tok_s:.0f} tok/s ({ev.n_prompt} tokens{reused})")
        self.prefill_bar.setRange(0, max(1, ev.n_prompt))
        self.prefill_bar.setValue(ev.n_prompt)
        self.ttft.setText(f"{ev.ttft_s * 1000:.0f} ms")
        if ev.speculation in ("draft", "lookup") and ev.drafted:
            self.accept.setText(f"{100 * ev.accepted / ev.drafted:.0f}% "
                                f"({ev.accepted}/{ev.drafted}, {ev.speculation})")
            self.draft_len.setText(str(ev.draft_len))
        else:
            self.accept.setText(ev.speculation if ev.speculation != "off" else "off")
            self.draft_len.setText("–")
        if ev.n_gen > 1:
            self.graph.add(ev.decode_tok_s)

    def on_sample(self, s: SystemSample) -> None:
        self.sample = s
        self._refresh_memory()

    # ---- memory -------------------------------------------------------------------------------

    def _refresh_memory(self) -> None:
        s = self.sample
        ours = sum(self.memory.get(k, 0) for k in ("weights", "kv", "compute", "draft"))
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
        items = [_legend(c, f"{label} {human_bytes(parts.get(k, 0))}")
                 for k, label, c in SEGMENTS if parts.get(k, 0) or k in ("weights", "other")]
        free = max(0, total - ours - other)
        items.append(_legend("#eef1f4", f"free {human_bytes(free)} of {human_bytes(total)}"))
        self.legend.setText(" &nbsp; ".join(items))
        self.legend.setToolTip(self.legend.text().replace("&nbsp;", " "))
