"""`moebench doctor` on the CPU: its CPU checks for real, its GPU checks through a fake probe
that plays a GPU shared with another process, in MIG mode, throttled, or held by a profiler."""

from __future__ import annotations

import pytest
from result_factory import run_cli

from moebench.tasks import doctor
from moebench.tasks.doctor import ERROR, OK, WARN, GpuState

GOOD = GpuState(other_processes=(), mig_enabled=False, persistence_on=True, sm_mhz=1980, sm_max_mhz=1980,
                mem_mhz=3201, mem_max_mhz=3201, clock_event_reasons=0)


class FakeProbe(doctor.GpuProbe):
    def __init__(self, state=GOOD, cupti_error=None, device_error=None, state_error=None):
        self._state, self.cupti_error, self.device_error, self.state_error = state, cupti_error, device_error, state_error

    def device(self):
        if self.device_error:
            raise self.device_error
        return "NVIDIA H200, sm_90, 132 SMs, L2 60 MiB, 140 GiB"

    def driver(self):
        return "580.00"

    def state(self):
        if self.state_error:
            raise self.state_error
        return self._state

    def cupti(self):
        if self.cupti_error:
            raise self.cupti_error
        return "cupti-python 13: subscribed and traced"


class CuptiError(Exception):
    """What cupti-python raises: the CUptiResult name and number."""


def _by_label(found):
    return {f.label: f for f in found}


def _well_formed(found):
    for f in found:
        line = f.line()
        assert f.level in (OK, WARN, ERROR) and line.startswith(f.level) and "\n" not in line, line
        assert f.level == OK or f.advice, f"{line}: a WARN or ERROR says what to do"


@pytest.fixture(scope="module")
def cpu_findings():
    return doctor.cpu_findings()


def test_the_cpu_checks_pass_on_a_cpu_machine(cpu_findings):
    _well_formed(cpu_findings)
    got = _by_label(cpu_findings)
    assert [f.level for f in cpu_findings] == [OK] * 4, [f.line() for f in cpu_findings]
    assert "a kernel ran on the CPU" in got["Triton interpreter"].detail
    assert "compiled for sm_90a" in got["NVRTC"].detail


def test_doctor_cpu_exits_0_and_lists_no_gpu_line():
    code, out, err = run_cli(["doctor", "--cpu"])
    assert code == 0, out + err
    labels = [ln.split(":")[0].split(None, 1)[1] for ln in out.splitlines()]
    assert "Triton interpreter" in labels and "compile cache" in labels
    assert not {"GPU", "CUPTI", "clocks", "MIG"} & set(labels)


def test_an_unwritable_cache_is_an_error_with_what_to_do(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("MOEBENCH_CACHE", str(blocked))  # the cache folder would be under a file
    f = _by_label(doctor.cpu_findings())["compile cache"]
    assert f.level == ERROR and f"cannot write into {blocked}" in f.detail and "MOEBENCH_CACHE" in f.advice


def test_a_quiet_gpu_is_all_ok(cpu_findings, monkeypatch):
    monkeypatch.setattr(doctor, "cpu_findings", lambda: cpu_findings)
    found = doctor.findings(probe=FakeProbe())
    _well_formed(found)
    got = _by_label(found)
    for label in ("GPU", "driver", "CUPTI", "other processes", "MIG", "persistence mode", "clocks"):
        assert got[label].level == OK, got[label].line()
    assert got["clocks"].detail.startswith("SM 1980/1980 MHz, memory 3201/3201 MHz")
    assert doctor.exit_code(found) == 0


def test_a_shared_throttled_partitioned_gpu_warns_each_thing():
    state = GpuState(other_processes=((4242, 30 * 2**30),), mig_enabled=True, persistence_on=False, sm_mhz=1200,
                     sm_max_mhz=1980, mem_mhz=3201, mem_max_mhz=3201, clock_event_reasons=0x20 | 0x1)
    found = doctor.gpu_findings(FakeProbe(state))
    _well_formed(found)
    got = _by_label(found)
    assert got["other processes"].level == WARN and "pid 4242 (30.0 GiB)" in got["other processes"].detail
    assert got["MIG"].level == WARN and "nvidia-smi -mig 0" in got["MIG"].advice
    assert got["persistence mode"].level == WARN and "nvidia-smi -pm 1" in got["persistence mode"].advice
    assert got["clocks"].level == WARN and "software thermal slowdown" in got["clocks"].detail
    assert "SM 1200/1980 MHz" in got["clocks"].detail
    assert doctor.exit_code(found) == 0  # warnings: a run works, its numbers need care


def test_an_idle_clock_is_no_warning_but_a_low_memory_clock_is():
    idle = doctor.gpu_findings(FakeProbe(GpuState((), False, True, 345, 1980, 3201, 3201, 0x1)))
    assert _by_label(idle)["clocks"].level == OK
    low = doctor.gpu_findings(FakeProbe(GpuState((), False, True, 1980, 1980, 1593, 3201, 0)))
    assert _by_label(low)["clocks"].level == WARN and "memory below its maximum" in _by_label(low)["clocks"].detail


def test_cupti_held_by_a_profiler_is_an_error_saying_so():
    found = doctor.gpu_findings(FakeProbe(cupti_error=CuptiError("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)")))
    _well_formed(found)
    f = _by_label(found)["CUPTI"]
    assert f.level == ERROR and "MULTIPLE_SUBSCRIBERS" in f.detail
    assert "another profiler holds CUPTI (ncu, nsys" in f.advice and "--timer events" in f.advice
    assert doctor.exit_code(found) == 1


def test_what_nvml_cannot_tell_is_a_warning_not_a_failure():
    unknown = GpuState(None, None, None, None, None, None, None, None)
    got = _by_label(doctor.gpu_findings(FakeProbe(unknown)))
    assert got["other processes"].level == WARN and "unknown" in got["other processes"].detail
    assert got["MIG"].level == OK and got["persistence mode"].level == WARN
    assert got["clocks"].detail.startswith("SM ?/? MHz")
    failed = _by_label(doctor.gpu_findings(FakeProbe(state_error=RuntimeError("NVML: Unknown Error"))))
    assert failed["GPU state"].level == WARN and "NVML: Unknown Error" in failed["GPU state"].detail


def test_no_gpu_is_one_error_and_no_probes_of_it():
    found = doctor.gpu_findings(FakeProbe(device_error=RuntimeError("no CUDA device visible")))
    _well_formed(found)
    assert [f.label for f in found] == ["GPU", "driver"]
    assert found[0].level == ERROR and "doctor --cpu" in found[0].advice
    assert doctor.exit_code(found) == 1
