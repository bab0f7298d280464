"""A hybrid CPU's performance cores (core/cpus.py `performance_cores`): Linux's perf PMU lists on
fake sysfs trees, macOS's perf levels through a fake sysctl, and what the default thread count, the
planner, the machine key and the probe make of them. No hybrid CPU is at hand: the trees follow
what Linux 5.13+ lists on an Alder Lake i7-12700H (6 P-cores with two threads each, 8 E-cores)."""
from __future__ import annotations

import platform
from pathlib import Path

import pytest

from ggufdesk.core import cpus, settings


def _sysfs(tmp_path: Path, core: str | None, atom: str | None, smt_pairs: int = 0) -> tuple[Path, Path]:
    devices, sys_cpu = tmp_path / "devices", tmp_path / "devices" / "system" / "cpu"
    for pmu, text in (("cpu_core", core), ("cpu_atom", atom)):
        if text is not None:
            (devices / pmu).mkdir(parents=True)
            (devices / pmu / "cpus").write_text(text + "\n")
    for c in range(2 * smt_pairs):  # logical CPUs 2k and 2k+1 share a core
        d = sys_cpu / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(f"{c - c % 2}-{c - c % 2 + 1}\n")
    return devices, sys_cpu


def _linux(devices: Path, sys_cpu: Path) -> int | None:
    return cpus.performance_cores("Linux", devices, sys_cpu)


@pytest.mark.parametrize(("text", "want"), [
    ("0-3,8", {0, 1, 2, 3, 8}), ("0-11", set(range(12))), ("5", {5}), ("12-19\n", set(range(12, 20))),
    ("", set()), ("a-b", set()), ("7-3", set()), ("-1", set()), ("0-99999999", set()), ("0-3,x", set()),
])
def test_a_cpu_list_reads_like_the_kernel_writes_it_and_nonsense_reads_empty(text, want):
    assert cpus.cpulist(text) == frozenset(want)


def test_an_alder_lake_counts_its_p_cores_once_each(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "affinity", lambda: frozenset(range(20)))
    devices, sys_cpu = _sysfs(tmp_path, "0-11", "12-19", smt_pairs=6)
    assert cpus.fast_cpus(devices) == frozenset(range(12))
    assert _linux(devices, sys_cpu) == 6  # two threads per P-core count once


def test_cores_that_are_alike_or_unreadable_say_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "affinity", lambda: frozenset(range(20)))
    for i, (core, atom) in enumerate([(None, None), ("0-11", None), (None, "12-19"), ("0-11", ""),
                                      ("", "12-19"), ("garbage", "12-19")]):
        devices, sys_cpu = _sysfs(tmp_path / str(i), core, atom)
        assert _linux(devices, sys_cpu) is None, (core, atom)
    assert cpus.performance_cores("Linux") in (None, *range(1, 4097))  # this host: whatever it is, no error


def test_the_affinity_picks_which_p_cores_count(tmp_path, monkeypatch):
    devices, sys_cpu = _sysfs(tmp_path, "0-11", "12-19", smt_pairs=6)
    monkeypatch.setattr(cpus, "affinity", lambda: frozenset({0, 1, 2, 12, 13}))
    assert _linux(devices, sys_cpu) == 2  # cores {0,1} and {2,3}
    monkeypatch.setattr(cpus, "affinity", lambda: frozenset(range(12, 20)))
    assert _linux(devices, sys_cpu) is None  # pinned to E-cores only: its cores are alike
    monkeypatch.setattr(cpus, "affinity", lambda: None)
    assert _linux(devices, sys_cpu) == 6


def test_without_topology_files_each_logical_cpu_is_a_core(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "affinity", lambda: None)
    devices, sys_cpu = _sysfs(tmp_path, "0-7", "8-15")  # no thread_siblings_list (a Core Ultra: no SMT)
    assert _linux(devices, sys_cpu) == 8


def test_macos_counts_perf_level_0_where_there_are_two_levels():
    def sysctl(values):
        return lambda name: values.get(name)

    m2 = {"hw.nperflevels": 2, "hw.perflevel0.physicalcpu": 4, "hw.perflevel1.physicalcpu": 4}
    assert cpus.performance_cores("Darwin", sysctl=sysctl(m2)) == 4
    assert cpus.performance_cores("Darwin", sysctl=sysctl({"hw.nperflevels": 1,
                                                            "hw.perflevel0.physicalcpu": 8})) is None
    assert cpus.performance_cores("Darwin", sysctl=sysctl({})) is None  # an Intel Mac: no perf levels
    assert cpus.performance_cores("Darwin", sysctl=sysctl({"hw.nperflevels": 2,
                                                            "hw.perflevel0.physicalcpu": 0})) is None
    assert cpus.performance_cores("Windows", sysctl=sysctl(m2)) is None


@pytest.mark.skipif(platform.system() != "Linux", reason="glibc has no sysctlbyname; macOS and BSDs do")
def test_sysctl_where_the_c_library_has_none_reads_none():
    assert cpus._sysctl_int("hw.nperflevels") is None


def test_the_default_thread_count_is_the_performance_cores_it_may_use(monkeypatch):
    monkeypatch.setattr(settings, "performance_cores", lambda: 6)
    monkeypatch.setattr(settings, "usable_cpus", lambda: 20)
    assert settings.default_threads() == 6
    monkeypatch.setattr(settings, "usable_cpus", lambda: 4)  # a container's quota of 4 CPUs
    assert settings.default_threads() == 4
    monkeypatch.setattr(settings, "performance_cores", lambda: None)
    monkeypatch.setattr(settings, "usable_cpus", lambda: 4096)
    import psutil

    assert settings.default_threads() == (psutil.cpu_count(logical=False) or 1)


def _hybrid_hw(fast: int | None, usable: int | None = None):
    from ggufdesk.core.hardware import CPUInfo, HardwareInfo

    cpu = CPUInfo(name="12th Gen Intel(R) Core(TM) i7-12700H", arch="x86_64", cores_physical=14,
                  cores_logical=20, flags=("avx2",), cores_usable=usable, cores_performance=fast)
    return HardwareInfo(gpus=(), cpu=cpu, ram_total=32 << 30, ram_available=16 << 30,
                        ram_bandwidth_gbs=60.0, ram_bandwidth_source="measured", cpu_gflops=300.0)


def test_the_planner_prices_the_threads_the_engine_will_run_on_a_hybrid_cpu():
    from ggufdesk.core import planner

    assert planner.engine_threads(_hybrid_hw(None)) == 14
    assert planner.engine_threads(_hybrid_hw(6)) == 6
    assert planner.engine_threads(_hybrid_hw(6, usable=4)) == 4


def test_a_hybrid_cpu_keeps_measurements_of_its_own_default(monkeypatch):
    from ggufdesk.core import hardware

    plain, fast = _hybrid_hw(None).cpu, _hybrid_hw(6).cpu
    assert hardware.machine_key(plain, 1 << 30).endswith("|20|1024")  # cores alike: the key as before
    assert hardware.machine_key(fast, 1 << 30) != hardware.machine_key(plain, 1 << 30)
    assert _hybrid_hw(6).to_json()["cpu"]["cores_performance"] == 6


def test_the_probe_and_the_wizard_say_which_cores_models_run_on(monkeypatch):
    from ggufdesk.cli.probe import describe_cpu
    from ggufdesk.core import hardware
    from ggufdesk.ui.services import describe_hardware

    assert "14 cores, 6 of them performance cores / 20 threads" in describe_cpu(_hybrid_hw(6).cpu)
    assert "performance" not in describe_cpu(_hybrid_hw(None).cpu)
    assert any("14 cores, 6 of them fast ones that models run on." in ln
               for ln in describe_hardware(_hybrid_hw(6)))
    monkeypatch.setattr(hardware, "cpu_info", lambda: _hybrid_hw(6).cpu)
    monkeypatch.setattr(hardware, "measurements", lambda cpu, ram, remeasure=False: (10.0, 50.0, "measured"))
    assert any("its 6 performance cores by default" in n for n in hardware.probe().notes)
    monkeypatch.setattr(hardware, "cpu_info", lambda: _hybrid_hw(None).cpu)
    assert not any("performance cores" in n for n in hardware.probe().notes)
