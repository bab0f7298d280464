"""The engine's decode probe: real llama.cpp on tiny probe models, and every way running it can fail."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ggufdesk.core import hardware, planner
from ggufdesk.core.errors import KnownError
from ggufdesk.core.gguf_meta import read_gguf
from ggufdesk.engine.link import decode_probe
from ggufdesk.engine.runtime.decode_probe import TYPES

SMALL = 4 << 20  # tiny models: the run is checked, not the machine


def _fake(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "fake_probe.py"
    script.write_text(body)
    return [sys.executable, str(script)]


GOOD = {"float_gbs": 20.0, "quant_gbs": 15.0,
        "type_gbs": {**dict.fromkeys(TYPES, 7.0), "F16": 20.0, "Q4_K": 15.0, "Q6_K": 12.0, "Q8_0": 14.0}}


def test_the_probe_measures_every_type_with_llama_cpp_and_leaves_no_model_behind(tmp_path):
    r = decode_probe.measure(folder=tmp_path, min_bytes=SMALL, timeout=600)
    assert set(r["type_gbs"]) == set(TYPES) >= {"F16", "BF16", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "IQ4_XS"}
    assert all(v > 0 for v in r["type_gbs"].values())
    assert r["float_gbs"] == r["type_gbs"]["F16"] and r["quant_gbs"] == r["type_gbs"]["Q4_K"]
    assert set(r["times_ms"]) == set(TYPES) and r["threads"] >= 1
    assert list(tmp_path.iterdir()) == []  # the models were removed


def test_a_token_under_the_fixed_cost_fails_the_probe_but_not_a_run_on_cache_sized_models(tmp_path):
    # tests probe models that fit a large L3 cache: on a fast host a token there took 1.47 ms, under
    # the planner's 1.5 ms fixed cost, which must not fail them; the probe's own models must not do it
    from ggufdesk.engine.runtime import decode_probe as rt

    info = read_gguf(rt.write_model(tmp_path / "m.gguf", rt.Shape(256, 2, 4, 2, 512, "Q8_0")))
    fast = hardware.cpu_fixed_s(planner.matmuls_per_token(info)) * 0.9
    with pytest.raises(KnownError, match="less than its fixed cost"):
        rt.gbs(fast, info)
    assert rt.gbs(fast, info, strict=False) == round(planner.weight_bytes_per_token(info) / fast / 1e9, 3)
    assert rt.gbs(1.0, info) == rt.gbs(1.0, info, strict=False) > 0  # a slow token: the same either way


def test_probe_models_are_what_the_planner_reads(tmp_path):
    from ggufdesk.engine.runtime import decode_probe as rt

    for qtype in rt.TYPES:
        shape = rt.shape_for(qtype, 600 << 20)
        info = read_gguf(rt.write_model(tmp_path / f"{qtype}.gguf", rt.Shape(256, 2, 4, 2, 512, qtype)))
        assert {t.ggml_type for t in info.tensors if t.layer is not None and len(t.shape) == 2} == {qtype}
        per_layer = sum(t.n_bytes for t in info.tensors if t.layer == 0)
        assert per_layer > 0 and shape.n_layer >= 2
    big = rt.shape_for("F16", 600 << 20)
    layer = 2 * (2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 5632 * 2048)
    assert big.n_layer * layer >= 600 << 20 > (big.n_layer - 1) * layer  # just enough layers


def test_recorded_figures_drive_the_planner(tmp_path):
    cmd = _fake(tmp_path, f"import json; print('llama.cpp says hello'); print(json.dumps({GOOD!r}))")
    decode_probe.run_and_record(command=cmd, folder=tmp_path)
    cal = hardware.calibration()
    assert cal.cpu_float_gbs == 20.0 and cal.cpu_quant_gbs == 15.0 and dict(cal.cpu_type_gbs)["Q6_K"] == 12.0
    assert decode_probe.ensure(command=_fake(tmp_path, "raise SystemExit('must not run again')")) is not None


def test_an_earlier_probe_without_the_types_timed_now_is_measured_again(tmp_path):
    old = {"float_gbs": 20.0, "quant_gbs": 15.0, "type_gbs": {"F16": 20.0, "Q4_K": 15.0}}
    decode_probe.run_and_record(command=_fake(tmp_path, f"import json; print(json.dumps({old!r}))"), folder=tmp_path)
    failing = _fake(tmp_path, "raise SystemExit('Illegal instruction')")
    assert decode_probe.ensure(command=failing, folder=tmp_path)["type_gbs"] == old["type_gbs"]  # kept, logged
    good = _fake(tmp_path, f"import json; print(json.dumps({GOOD!r}))")
    assert decode_probe.ensure(command=good, folder=tmp_path)["type_gbs"] == GOOD["type_gbs"]  # measured anew


def test_a_probe_taken_with_another_llama_build_is_read_until_measured_again(tmp_path, monkeypatch):
    """A wheel rebuilt with other flags decodes at other rates: its figures are taken anew; until then,
    and when that fails, the old build's figures (same processor) still drive the planner."""
    monkeypatch.setattr(hardware, "llama_build", lambda: "avx2-build")
    decode_probe.run_and_record(command=_fake(tmp_path, f"import json; print(json.dumps({GOOD!r}))"), folder=tmp_path)
    assert hardware.decode_probe_is_current()
    monkeypatch.setattr(hardware, "llama_build", lambda: "avx512-build")
    assert not hardware.decode_probe_is_current() and hardware.decode_probe()["float_gbs"] == 20.0
    failing = _fake(tmp_path, "raise SystemExit('Illegal instruction')")
    assert decode_probe.ensure(command=failing, folder=tmp_path)["float_gbs"] == 20.0  # kept, logged
    faster = {**GOOD, "float_gbs": 30.0, "type_gbs": {**GOOD["type_gbs"], "F16": 30.0}}
    assert decode_probe.ensure(command=_fake(tmp_path, f"import json; print(json.dumps({faster!r}))"),
                               folder=tmp_path)["float_gbs"] == 30.0
    assert hardware.decode_probe_is_current()  # and not measured again on the next start
    assert decode_probe.ensure(command=failing, folder=tmp_path)["float_gbs"] == 30.0


def test_the_llama_build_fingerprint_follows_the_library_files(tmp_path, monkeypatch):
    import importlib.util
    import os
    from types import SimpleNamespace

    pkg = tmp_path / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    lib = pkg / "lib" / "libggml-cpu.so.0.25.3"
    lib.write_bytes(b"avx2" * 100)
    (pkg / "lib" / "libggml-cpu.so").symlink_to(lib.name)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(origin=str(pkg / "__init__.py")))
    first = hardware.llama_build()
    assert first and hardware.llama_build() == first
    lib.write_bytes(b"avx512" * 100)
    os.utime(lib, ns=(1, 1))
    assert hardware.llama_build() not in ("", first)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # not installed: no fingerprint, no error
    assert hardware.llama_build() == ""


@pytest.mark.parametrize("body, why", [
    ("print('not json at all')", "without a result"),
    ("import sys; sys.stderr.write('Illegal instruction\\n'); sys.exit(132)", "Illegal instruction"),
    ("import json; print(json.dumps({'error': 'No space left on device'}))", "No space left on device"),
    ("import json; print(json.dumps({'float_gbs': -1, 'quant_gbs': 'fast'}))", "no usable rates"),
    ("import json; print(json.dumps([1, 2]))", "without a result"),
])
def test_a_failed_probe_is_a_clear_error_and_records_nothing(tmp_path, body, why):
    with pytest.raises(KnownError, match=why):
        decode_probe.run_and_record(command=_fake(tmp_path, body), folder=tmp_path)
    assert hardware.decode_probe() is None and hardware.calibration().cpu_type_gbs == ()
    assert decode_probe.ensure(command=_fake(tmp_path, body), folder=tmp_path) is None  # logged, not raised


def test_a_hung_probe_is_stopped_and_its_models_removed(tmp_path):
    body = ("import pathlib, sys, time; d = pathlib.Path(sys.argv[1]) / 'ggufdesk-probe-x'; d.mkdir();"
            " (d / 'F16.gguf').write_bytes(b'0' * 1000); time.sleep(60)")
    with pytest.raises(KnownError, match="did not finish"):
        decode_probe.measure(command=_fake(tmp_path, body), folder=tmp_path, timeout=2)
    assert not list(tmp_path.glob("ggufdesk-probe-*"))


def test_a_folder_that_cannot_be_made_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(KnownError, match="could not start"):
        decode_probe.measure(folder=blocker / "sub", command=_fake(tmp_path, "print('{}')"))


def test_the_probe_in_process_reports_a_full_disk_as_an_error(tmp_path, monkeypatch, capsys):
    from ggufdesk.engine.runtime import decode_probe as rt

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rt, "write_model", full)
    assert rt.main([str(tmp_path), str(SMALL)]) == 1
    assert "No space left" in json.loads(capsys.readouterr().out)["error"]
    assert list(tmp_path.iterdir()) == []
