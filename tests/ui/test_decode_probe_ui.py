"""The app times llama.cpp's decode once (engine.link.decode_probe) before it describes the computer."""
from __future__ import annotations

import sys
from dataclasses import replace

from ggufdesk.core import hardware
from ggufdesk.ui.services import ModelServices, describe_hardware
from tests.ui.test_wizard import fake_hw


def test_the_app_services_run_the_decode_probe_once(monkeypatch):
    from ggufdesk.engine.link import decode_probe

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: 20.0)
    monkeypatch.setattr(hardware, "measure_cpu_gflops", lambda *a, **k: 100.0)
    calls = []

    def fake_measure(**kw):
        calls.append(kw)
        return {"float_gbs": 21.0, "quant_gbs": 17.0,
                "type_gbs": {**dict.fromkeys(hardware.DECODE_PROBE_TYPES, 8.0), "F16": 21.0, "Q4_K": 17.0}}

    monkeypatch.setattr(decode_probe, "measure", fake_measure)
    assert ModelServices().probe().calibration.cpu_type_gbs == ()  # tests and tools: no probe
    hw = ModelServices(decode_probe=True).probe()
    assert hw.calibration.cpu_quant_gbs == 17.0 and len(calls) == 1
    ModelServices(decode_probe=True).probe()
    assert len(calls) == 1  # once per machine
    assert any("timed on this processor" in ln and "17 words per second" in ln for ln in describe_hardware(hw))


def test_a_failed_probe_still_describes_the_computer(monkeypatch):
    from ggufdesk.core.errors import KnownError
    from ggufdesk.engine.link import decode_probe

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: 20.0)
    monkeypatch.setattr(hardware, "measure_cpu_gflops", lambda *a, **k: 100.0)

    def broken(**kw):
        raise KnownError("the decode probe ended without a result (exit 132)")

    monkeypatch.setattr(decode_probe, "measure", broken)
    hw = ModelServices(decode_probe=True).probe()
    assert hw.calibration.cpu_type_gbs == () and hw.ram_bandwidth_gbs == 20.0
    assert not any("timed on this processor" in ln for ln in describe_hardware(replace(fake_hw(0))))
