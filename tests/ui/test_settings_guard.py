"""The context length is bounded by the model's trained length; beyond what fits, the planner's estimate warns."""
from __future__ import annotations

from ggufdesk.core.settings import LoadSettings, SpeculationSettings
from ggufdesk.ui.services import ContextEstimate, ModelServices
from ggufdesk.ui.settings_dialog import SettingsDialog

GB = 1024**3


def fake_estimate(load: LoadSettings) -> ContextEstimate:
    kv = load.n_ctx * 128 * 1024  # 128 KiB per token
    ram = GB + kv
    return ContextEstimate(n_ctx=load.n_ctx, n_ctx_train=32768, kv_bytes=kv, ram_bytes=ram,
                           vram_bytes=0, ram_budget=3 * GB, vram_budget=0, fits=ram <= 3 * GB)


def test_context_cannot_exceed_the_trained_length(qtbot):
    dlg = SettingsDialog(LoadSettings(n_ctx=4096), SpeculationSettings(), n_ctx_train=32768)
    qtbot.addWidget(dlg)
    box = dlg.w["n_ctx"]
    box.setValue(999_999)
    assert box.value() == 32768  # 999999 was accepted before, and allocated 13 GB of KV cache
    assert dlg.values()[0].n_ctx == 32768


def test_a_context_that_does_not_fit_shows_the_planners_estimate(qtbot):
    dlg = SettingsDialog(LoadSettings(n_ctx=4096), SpeculationSettings(), n_ctx_train=32768,
                         estimate=fake_estimate)
    qtbot.addWidget(dlg)
    dlg.show()
    qtbot.waitUntil(lambda: dlg.last_estimate is not None, timeout=5000)
    assert not dlg.ctx_warning.isVisible()
    with qtbot.waitSignal(dlg.memory_checked, timeout=5000) as blocker:
        dlg.w["n_ctx"].setValue(32768)
    est = blocker.args[0]
    assert not est.fits and dlg.ctx_warning.isVisible()
    text = dlg.ctx_warning.text()
    assert "32,768-token context needs about 5.0 GB of RAM (KV cache 4.0 GB)" in text
    assert "more than the 3.0 GB free here" in text
    with qtbot.waitSignal(dlg.memory_checked, timeout=5000):
        dlg.w["n_ctx"].setValue(8192)
    assert not dlg.ctx_warning.isVisible()


def test_services_estimate_a_real_model_with_the_planner(tiny_model):
    from ggufdesk.core.hardware import CPUInfo, HardwareInfo

    svc = ModelServices()
    cpu = CPUInfo(name="Test CPU", arch="x86_64", cores_physical=4, cores_logical=8, flags=())
    svc.hw = HardwareInfo(gpus=(), cpu=cpu, ram_total=16 * GB, ram_available=8 * GB,
                          ram_bandwidth_gbs=20.0, ram_bandwidth_source="assumed")
    est = svc.context_estimate(str(tiny_model), LoadSettings(n_ctx=512))
    assert est is not None and est.n_ctx_train > 0 and est.kv_bytes > 0 and est.fits
    assert "512-token context needs about" in est.words() and "fits here" in est.words()
    assert svc.context_estimate(None, LoadSettings()) is None
    assert svc.context_estimate("/no/such.gguf", LoadSettings()) is None
