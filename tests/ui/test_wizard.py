"""The model picker wizard with a fake probe, hub and downloader."""
from __future__ import annotations

import threading
from pathlib import Path


from ggufdesk.core.errors import KnownError
from ggufdesk.core.hardware import CPUInfo, GPUInfo, HardwareInfo
from ggufdesk.ui.services import (
    DownloadStopped, ModelChoice, ModelServices, describe_hardware,
)
from ggufdesk.ui.wizard import DOWNLOAD_PAGE, FINISH_PAGE, MODEL_PAGE
from tests.fixtures.ggufs import write_tiny_llama

GB = 1024**3


def fake_hw(vram: int = 8 * GB) -> HardwareInfo:
    gpus = (GPUInfo(index=0, name="GeForce Test", vram_total=vram, vram_free=vram - GB,
                    vram_used=GB, vram_used_by_others=0, bandwidth_gbs=448.0),) if vram else ()
    return HardwareInfo(gpus=gpus, cpu=CPUInfo(name="Test CPU", arch="x86_64", cores_physical=8,
                                               cores_logical=16, flags=()),
                        ram_total=32 * GB, ram_available=24 * GB, ram_bandwidth_gbs=40.0,
                        ram_bandwidth_source="assumed")


class FakeServices:
    """Same methods as ModelServices; downloads write bytes into tmp, chunk by chunk."""

    def __init__(self, tmp: Path, *, online: bool = True, block: threading.Event | None = None,
                 fail_times: int = 0) -> None:
        self.tmp, self.online, self.block, self.fail_times = tmp, online, block, fail_times
        self.downloads: list[str] = []
        self.started = threading.Event()

    def probe(self):
        return fake_hw()

    def describe(self, hw):
        return describe_hardware(hw)

    def hub_reachable(self):
        return self.online

    def recommendations(self, hw):
        draft = ModelChoice(label="Tiny draft Q8_0", source="catalog", repo="org/tiny-GGUF",
                            filename="tiny-q8_0.gguf", size_bytes=4096)
        return [
            ModelChoice(label="Big model Q4_K_M", source="catalog", repo="org/big-GGUF",
                        filename="big-q4_k_m.gguf", size_bytes=200 * GB, fit="too_large"),
            ModelChoice(label="Good model Q4_K_M", source="catalog", repo="org/good-GGUF",
                        filename="good-q4_k_m.gguf", size_bytes=16384, fit="full_gpu",
                        n_gpu_layers=-1, pred_decode_tok_s=90.0, pred_prefill_tok_s=900.0,
                        recommended=True, draft=draft),
        ]

    def lookup_repo(self, repo, hw):
        if repo == "nobody/nothing":
            raise KnownError("nobody/nothing is not on Hugging Face (404)")
        return [ModelChoice(label=f"{repo} Q8_0", source="repo", repo=repo, filename="x-q8_0.gguf",
                            size_bytes=1000, fit="cpu")]

    def local_choices(self, hw):
        return [ModelChoice(label="Gemma 3 270M (starter, works offline)", source="starter",
                            size_bytes=1000, fit="cpu")]

    def choice_for_file(self, path, hw):
        return ModelServices.choice_for_file(ModelServices(), path, hw)

    def download(self, choice, on_progress, control):
        if self.fail_times:
            self.fail_times -= 1
            raise KnownError("the connection to the hub dropped")
        out = self.tmp / (choice.filename or "starter.gguf")
        total = choice.size_bytes
        have = out.stat().st_size if out.exists() else 0  # resume where a pause stopped
        with out.open("ab") as f:
            while have < total:
                if have:
                    self.started.set()  # a first chunk is on disk
                    if self.block is not None:
                        self.block.wait(5)
                if control.stopped:
                    raise DownloadStopped()
                n = min(1024, total - have)
                f.write(b"\0" * n)
                have += n
                f.flush()
                on_progress(have, total)
        self.downloads.append(choice.label)
        return out

    def context_estimate(self, model, load):
        from ggufdesk.ui.services import ContextEstimate

        kv = load.n_ctx * 64 * 1024
        return ContextEstimate(n_ctx=load.n_ctx, n_ctx_train=8192, kv_bytes=kv, ram_bytes=GB + kv,
                               vram_bytes=0, ram_budget=2 * GB, vram_budget=0, fits=GB + kv <= 2 * GB)

    def recommended_settings(self, model):
        from ggufdesk.core.settings import LoadSettings, SpeculationSettings

        return LoadSettings(), SpeculationSettings()


def to_model_page(qtbot, wiz):
    with qtbot.waitSignal(wiz.probe_done, timeout=5000):
        wiz.show()
    assert "GeForce Test with 8.0 GB" in wiz.hw_page.text.text()
    # 40 GB/s x the quantized efficiency (planner.EFF_CPU_QUANT): what the model list predicts too
    assert "a 1 GB model writes roughly 25 words per second" in wiz.hw_page.text.text()
    with qtbot.waitSignal(wiz.choices_loaded, timeout=5000):
        wiz.next()
    assert wiz.currentId() == MODEL_PAGE


def test_full_flow_downloads_model_and_draft_then_loads(qtbot, wizard, tmp_path):
    svc = FakeServices(tmp_path)
    wiz = wizard(svc)
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    assert page.current().label == "Good model Q4_K_M"  # the recommended row is preselected
    assert page.model.data(page.model.index(0, 3)) == "too large"
    assert page.draft_box.isVisibleTo(page) and page.draft_box.isChecked()
    assert page.isComplete()
    page.table.selectRow(0)
    assert not page.isComplete()  # too large: cannot go on
    page.table.selectRow(1)
    with qtbot.waitSignal(wiz.download_finished, timeout=10000):
        wiz.next()
    assert svc.downloads == ["Good model Q4_K_M", "Tiny draft Q8_0"]
    assert wiz.download_page.isComplete()
    # Finished downloads move on by themselves: no stop on a 100 % page with live Pause/Cancel.
    assert wiz.currentId() == FINISH_PAGE
    assert not wiz.download_page.pause_btn.isVisibleTo(wiz.download_page)
    assert not wiz.download_page.cancel_btn.isVisibleTo(wiz.download_page)
    # The page names the button the user will press ("Load"), not another one.
    assert wiz.buttonText(wiz.WizardButton.FinishButton) == "Load"
    assert wiz.finish_page.text.text().startswith("Press Load to open good-q4_k_m.gguf with "
                                                  "tiny-q8_0.gguf as draft")
    wiz.accept()
    sel = wiz.selection
    assert sel.path == tmp_path / "good-q4_k_m.gguf" and sel.path.stat().st_size == 16384
    assert sel.speculation.mode == "draft"
    assert sel.speculation.draft_model == str(tmp_path / "tiny-q8_0.gguf")
    assert sel.load.n_gpu_layers == -1


def test_pause_resume_and_speed(qtbot, wizard, tmp_path):
    gate = threading.Event()
    svc = FakeServices(tmp_path, block=gate)
    wiz = wizard(svc)
    to_model_page(qtbot, wiz)
    wiz.model_page.draft_box.setChecked(False)
    wiz.next()
    dl = wiz.download_page
    assert svc.started.wait(5)
    with qtbot.waitSignal(wiz.download_state, timeout=5000) as blocker:
        dl.pause_btn.click()
        gate.set()
    assert blocker.args == ["paused"] and dl.state == "paused"
    assert "Paused" in dl.detail.text()
    part = (tmp_path / "good-q4_k_m.gguf").stat().st_size
    assert 0 < part < 16384  # the part is kept for resuming
    with qtbot.waitSignal(wiz.download_finished, timeout=10000):
        dl.pause_btn.click()  # Resume
    assert (tmp_path / "good-q4_k_m.gguf").stat().st_size == 16384
    assert dl.isComplete()


def test_cancel_goes_back_and_failure_offers_retry(qtbot, wizard, tmp_path):
    svc = FakeServices(tmp_path, fail_times=1)
    wiz = wizard(svc)
    to_model_page(qtbot, wiz)
    with qtbot.waitSignal(wiz.download_state, timeout=5000) as blocker:
        wiz.next()
    assert blocker.args == ["failed"]
    assert "the connection to the hub dropped" in wiz.download_page.detail.text()
    assert wiz.download_page.pause_btn.text() == "Retry"
    with qtbot.waitSignal(wiz.download_finished, timeout=10000):
        wiz.download_page.pause_btn.click()
    assert wiz.currentId() == FINISH_PAGE
    wiz.back()
    assert wiz.currentId() == DOWNLOAD_PAGE
    wiz.download_page.cancel()
    assert wiz.currentId() == MODEL_PAGE


def test_offline_offers_the_starter_and_a_local_file(qtbot, wizard, tmp_path):
    svc = FakeServices(tmp_path, online=False)
    wiz = wizard(svc)
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    assert "Offline" in page.status.text()
    assert [r.source for r in page.model.rows] == ["starter"]
    local = tmp_path / "mine.gguf"
    write_tiny_llama(local)
    page.pick_file(str(local))
    assert page.current().path == local
    assert page.nextId() == FINISH_PAGE  # on disk: nothing to download
    wiz.next()
    wiz.accept()
    assert wiz.selection.path == local and wiz.selection.speculation.mode == "off"
    page.pick_file(str(tmp_path / "missing.gguf"))
    assert "is not a file" in page.status.text()


def test_typed_repo_lookup_and_its_errors(qtbot, wizard, tmp_path):
    wiz = wizard(FakeServices(tmp_path))
    to_model_page(qtbot, wiz)
    page = wiz.model_page
    page.repo.setText("someone/thing-GGUF")
    with qtbot.waitSignal(wiz.choices_loaded, timeout=5000):
        page.lookup_btn.click()
    assert page.current().repo == "someone/thing-GGUF"
    assert "1 GGUF files in someone/thing-GGUF" in page.status.text()
    page.repo.setText("nobody/nothing")
    with qtbot.waitSignal(wiz.choices_loaded, timeout=5000):
        page.lookup_btn.click()
    assert "404" in page.status.text()


def test_one_planner_and_plain_words(tmp_path):
    # the window's plans come from core/planner.py alone: a file it cannot read is "unknown", with why
    hw = fake_hw(vram=0)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    c = ModelServices().plan(ModelChoice(label="x", source="file", path=bad, size_bytes=10), hw)
    assert c.fit == "unknown" and c.note and c.pred_decode_tok_s is None
    nothing = ModelServices().plan(ModelChoice(label="s", source="starter", size_bytes=GB), hw)
    assert nothing.fit == "unknown"
    words = " ".join(describe_hardware(hw))
    assert "No graphics card we can use" in words and "32.0 GB" in words


def test_the_hardware_page_speaks_with_the_planner_and_the_recorded_runs():
    from dataclasses import replace

    from ggufdesk.core.hardware import Calibration

    # this machine's recorded runs replace the fitted efficiency, in the sentence as in the list
    hw = replace(fake_hw(vram=0), calibration=Calibration(cpu_gbs=12.0))
    assert "a 1 GB model writes roughly 12 words per second" in " ".join(describe_hardware(hw))
    # a machine whose cores, not its memory, are the limit (planner.PER_THREAD_QUANT per core)
    hw = replace(fake_hw(vram=0), cpu=CPUInfo(name="Slow", arch="x86_64", cores_physical=1, cores_logical=1,
                                              flags=()))
    assert "a 1 GB model writes roughly 10 words per second" in " ".join(describe_hardware(hw))


def test_the_hardware_page_says_no_gpu_once():
    from dataclasses import replace

    hw = replace(fake_hw(vram=0), notes=("no NVIDIA driver in use (NVML Shared Library Not Found)",
                                         "no usable GPU found: models run on the CPU"))
    words = " ".join(describe_hardware(hw))
    assert words.count("GPU") + words.count("graphics card") + words.count("NVIDIA") == 1, words
    hw = replace(fake_hw(), notes=("GPU 1: NVML reports no memory information",))
    assert "Note: GPU 1: NVML reports no memory information." in describe_hardware(hw)
