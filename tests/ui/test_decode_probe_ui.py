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


def test_the_probe_waits_for_the_engine_starting_beside_it(monkeypatch):
    """The app starts its engine and the wizard at once: the probe's timings must not share the cores
    with the engine's start, so it waits for the engine's Ready (its device list) first, and only when
    it will measure."""
    from ggufdesk.engine.link import decode_probe

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(hardware, "measure_ram_bandwidth", lambda *a, **k: 20.0)
    monkeypatch.setattr(hardware, "measure_cpu_gflops", lambda *a, **k: 100.0)
    events: list[str] = []
    polls = iter([[], [], [{"name": "CPU", "type": "cpu"}]])

    def devices():
        d = next(polls, [{"name": "CPU", "type": "cpu"}])
        events.append("ready" if d else "starting")
        return d

    def fake_measure(**kw):
        events.append("probe")
        return {"float_gbs": 21.0, "quant_gbs": 17.0,
                "type_gbs": {**dict.fromkeys(hardware.DECODE_PROBE_TYPES, 8.0), "F16": 21.0, "Q4_K": 17.0}}

    monkeypatch.setattr(decode_probe, "measure", fake_measure)
    ModelServices(engine_devices=devices, decode_probe=True).probe()
    assert events[:4] == ["starting", "starting", "ready", "probe"]
    events.clear()
    ModelServices(engine_devices=devices, decode_probe=True).probe()  # recorded: no probe, no extra wait
    assert events == ["ready"]


def test_the_wizard_says_how_many_cores_a_container_or_affinity_leaves_usable():
    hw = fake_hw(0)
    assert not any("usable here" in ln for ln in describe_hardware(hw))
    limited = replace(hw, cpu=replace(hw.cpu, cores_usable=2))
    assert any("8 cores (2 usable here)" in ln for ln in describe_hardware(limited))
