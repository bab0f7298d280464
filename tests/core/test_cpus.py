"""The CPUs this process may use (core/cpus.py): affinity, cgroup quotas of both versions, and what
the engine's default thread count makes of them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggufdesk.core import cpus, settings


def _v2(tmp_path: Path, where: str, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    for rel, text in limits.items():
        d = root / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.max").write_text(text)
    (root / where.lstrip("/")).mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(f"0::{where}\n")
    return root, proc


def test_a_v2_quota_on_the_process_cgroup_or_an_ancestor_counts_the_tightest(tmp_path):
    root, proc = _v2(tmp_path, "/user.slice/app.service", {
        "": "max 100000\n", "user.slice": "300000 100000\n", "user.slice/app.service": "150000 100000\n"})
    assert cpus.cgroup_cpus(root, proc) == 1.5
    root, proc = _v2(tmp_path / "b", "/a/b", {"a": "50000 100000", "a/b": "max 100000"})
    assert cpus.cgroup_cpus(root, proc) == 0.5


def test_a_container_s_namespace_reads_its_own_cgroup_at_the_root(tmp_path):
    root, proc = _v2(tmp_path, "/", {"": "200000 100000\n"})
    assert cpus.cgroup_cpus(root, proc) == 2.0


def test_a_v1_cfs_quota_is_read_from_the_cpu_hierarchy(tmp_path):
    d = tmp_path / "cg" / "cpu,cpuacct" / "docker" / "abc"
    d.mkdir(parents=True)
    (d / "cpu.cfs_quota_us").write_text("100000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    (d.parent / "cpu.cfs_quota_us").write_text("-1\n")
    proc = tmp_path / "cgroup"
    proc.write_text("5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cpus.cgroup_cpus(tmp_path / "cg", proc) == 1.0


@pytest.mark.parametrize("text", ["max 100000", "-1 100000", "garbage", "", "0 100000", "100000 0",
                                  "100000", "1e5 1e5", "\xff\xfe"])
def test_no_quota_or_nonsense_reads_as_none(tmp_path, text):
    root, proc = _v2(tmp_path, "/x", {"x": text})
    assert cpus.cgroup_cpus(root, proc) is None


def test_no_cgroup_file_or_a_path_outside_the_mount_reads_as_none(tmp_path):
    assert cpus.cgroup_cpus(tmp_path, tmp_path / "missing") is None
    proc = tmp_path / "cgroup"
    proc.write_text("0::/../../etc\n")
    (tmp_path / "cg").mkdir()
    (tmp_path / "cpu.max").write_text("100000 100000")
    assert cpus.cgroup_cpus(tmp_path / "cg", proc) is None
    proc.write_bytes(b"\xff\xfe not text")
    assert cpus.cgroup_cpus(tmp_path, proc) is None


def test_usable_cpus_takes_the_affinity_and_the_quota_rounded_up(monkeypatch):
    monkeypatch.setattr(cpus, "affinity", lambda: frozenset({0, 1, 2, 3}))
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: None)
    assert cpus.usable_cpus() == 4
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: 1.5)
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: 2.0)
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: 0.2)
    assert cpus.usable_cpus() == 1
    monkeypatch.setattr(cpus, "affinity", lambda: None)
    monkeypatch.setattr(cpus, "cgroup_cpus", lambda: None)
    assert cpus.usable_cpus() == (os.cpu_count() or 1)


def test_the_default_thread_count_is_no_more_than_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(settings, "usable_cpus", lambda: 1)
    assert settings.default_threads() == 1
    assert settings.LoadSettings().threads == settings.LoadSettings().threads_batch == 1
    assert settings.LoadSettings(n_threads=4).threads == 4  # asked for: the user's choice stands
    monkeypatch.setattr(settings, "usable_cpus", lambda: 4096)
    assert 1 <= settings.default_threads() <= (os.cpu_count() or 1)


def test_this_process_reads_its_own_affinity():
    got = cpus.affinity()
    if hasattr(os, "sched_getaffinity"):
        assert got == frozenset(os.sched_getaffinity(0))
    assert 1 <= cpus.usable_cpus() <= (os.cpu_count() or 1)


def _hw(usable: int | None):
    from ggufdesk.core.hardware import CPUInfo, HardwareInfo

    cpu = CPUInfo(name="test", arch="x86_64", cores_physical=16, cores_logical=32, flags=("avx2",),
                  cores_usable=usable)
    return HardwareInfo(gpus=(), cpu=cpu, ram_total=64 << 30, ram_available=32 << 30,
                        ram_bandwidth_gbs=200.0, ram_bandwidth_source="measured", cpu_gflops=100.0)


def test_the_planner_prices_a_cpu_decode_on_the_threads_the_engine_will_run():
    from ggufdesk.core import planner

    assert planner.engine_threads(_hw(None)) == 16
    assert planner.engine_threads(_hw(2)) == 2
    # the cores' rate bounds the read rate where RAM is fast: two CPUs of a 16-core host read less
    assert planner.cpu_read_gbs(_hw(2)) < planner.cpu_read_gbs(_hw(None))


def test_the_probe_says_when_fewer_cpus_are_usable(monkeypatch):
    from ggufdesk.core import hardware

    monkeypatch.setattr(hardware, "usable_cpus", lambda: 1)
    info = hardware.cpu_info()
    assert info.cores_usable == (1 if info.cores_logical > 1 else None)
    monkeypatch.setattr(hardware, "usable_cpus", lambda: 4096)
    assert hardware.cpu_info().cores_usable is None
    assert _hw(2).to_json()["cpu"]["cores_usable"] == 2


def test_the_probe_notes_the_limit_and_the_threads_it_leaves(monkeypatch):
    from dataclasses import replace

    from ggufdesk.core import hardware

    limited = replace(_hw(2).cpu, cores_logical=4)
    monkeypatch.setattr(hardware, "cpu_info", lambda: limited)
    monkeypatch.setattr(hardware, "measurements", lambda cpu, ram, remeasure=False: (10.0, 50.0, "measured"))
    notes = hardware.probe().notes
    assert any("may use 2 of the 4 CPUs" in n and "on 2 threads by default" in n for n in notes), notes
    monkeypatch.setattr(hardware, "cpu_info", lambda: replace(limited, cores_usable=1))
    assert any("on 1 thread by default" in n for n in hardware.probe().notes)
    monkeypatch.setattr(hardware, "cpu_info", lambda: replace(limited, cores_usable=None))
    assert not any("may use" in n for n in hardware.probe().notes)


def test_a_limited_process_keeps_measurements_and_a_decode_probe_of_its_own():
    from dataclasses import replace

    from ggufdesk.core.hardware import machine_key

    cpu = _hw(None).cpu
    assert machine_key(cpu, 1 << 30).endswith("|32|1024")  # unlimited: the key of earlier versions
    assert machine_key(replace(cpu, cores_usable=2), 1 << 30) != machine_key(cpu, 1 << 30)
    assert machine_key(replace(cpu, cores_usable=2), 1 << 30) != machine_key(replace(cpu, cores_usable=4), 1 << 30)


def test_a_limited_process_s_decode_probe_does_not_replace_the_whole_machine_s(monkeypatch):
    from ggufdesk.core import hardware

    monkeypatch.setattr(hardware, "cpu_limit", lambda: None)
    hardware.record_decode_probe({"float_gbs": 20.0, "quant_gbs": 15.0, "type_gbs": {"Q4_K": 15.0}})
    monkeypatch.setattr(hardware, "cpu_limit", lambda: 1)
    assert hardware.decode_probe() is None and not hardware.decode_probe_is_current()  # to be probed here
    hardware.record_decode_probe({"float_gbs": 9.0, "quant_gbs": 7.0, "type_gbs": {"Q4_K": 7.0}})
    assert hardware.decode_probe()["quant_gbs"] == 7.0
    monkeypatch.setattr(hardware, "cpu_limit", lambda: None)
    assert hardware.decode_probe()["quant_gbs"] == 15.0 and hardware.decode_probe_is_current()
