"""The HBM read floor on the CPU: the best layout wins by its median, a layout the audit mostly
rejects is not read, the warm-up burst runs before the first timed read and none of its kernels
enters a sample, the result records the floor and the datasheet beside it (and a version 1 file
still loads), and the read kernel compiles for sm_90a by NVRTC without spills."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pytest
import torch
from timing_fakes import FakeGpu, FakeTracer, make_result

from moebench.timing.measure import TimingBackend, TimingProtocol, measure
from moebench.timing.read_floor import READ_CONFIGS, ReadProbe, best_read, config_named
from moebench.record.device_peaks import hbm_datasheet
from moebench.record.schema import GpuInfo
from moebench.analysis.load import load, loads
from moebench.record.store import dumps
from moebench.errors import UserError
from moebench.timing.engine import Unit
from moebench.timing.timers import KernelRecordTimer

H100 = "NVIDIA H100 80GB HBM3"


def test_the_layout_with_the_shortest_median_wins_and_the_datasheet_stands_beside_it():
    gib = 2**30
    floor = best_read({"8x256x4": [360_000, 350_000, 340_000], "4x256x8": [330_000, 340_000, 900_000],
                       "2x512x8": [400_000] * 3}, gib, H100, 3, "m")
    assert floor.config == "4x256x8" and floor.bytes_per_s == pytest.approx(gib / 340e-6)
    assert set(floor.configs) == {"8x256x4", "4x256x8", "2x512x8"}
    assert floor.configs["2x512x8"] == pytest.approx(gib / 400e-6)
    assert floor.datasheet_bytes_per_s == 3.35e12 and "H100 SXM: 3.35TB/s" in floor.datasheet_source
    assert floor.of_datasheet == pytest.approx(gib / 340e-6 / 3.35e12)
    assert floor.samples == 3 and floor.nbytes == gib


def test_a_layout_the_audit_mostly_rejected_is_not_read_and_none_left_is_none():
    # the fastest layout kept one of its 4 samples: a median of one is no reading
    floor = best_read({"fast": [100_000], "steady": [200_000] * 4}, 10**9, "some other GPU", 4, "m")
    assert floor.config == "steady" and set(floor.configs) == {"steady"}
    assert floor.datasheet_bytes_per_s is None and floor.of_datasheet is None
    assert best_read({"a": [1], "b": []}, 10**9, None, 4, "m") is None
    assert best_read({"a": [0, 0, 0, 0]}, 10**9, None, 4, "m") is None  # no time is not infinitely fast


def test_datasheet_table_matches_names_exactly():
    assert hbm_datasheet("NVIDIA H200").bytes_per_s == 4.8e12
    assert hbm_datasheet("NVIDIA H100 PCIe").bytes_per_s == 2.0e12
    assert hbm_datasheet("NVIDIA H800").bytes_per_s == 3.35e12
    assert hbm_datasheet("NVIDIA H100 NVL") is None and hbm_datasheet(None) is None


def test_layouts_are_named_and_each_keeps_enough_bytes_in_flight():
    assert [c.name for c in READ_CONFIGS] == ["8x256x4", "16x128x4", "4x256x8", "2x512x8"]
    # ~3.35 TB/s x ~0.7 us of latency over 132 SMs is ~18 KB an SM; every layout keeps far more
    assert all(c.in_flight_bytes_per_sm() >= 64 * 1024 for c in READ_CONFIGS)
    assert all(c.ctas_per_sm * c.threads <= 2048 for c in READ_CONFIGS)  # an sm_90 SM's threads
    assert config_named("2x512x8").kernel == "moebench_read_probe_u8"
    with pytest.raises(UserError, match="unknown read layout '3x3x3'"):
        config_named("3x3x3")


def _backend(gpu: FakeGpu, events: list, durations: dict[str, int]) -> TimingBackend:
    def warm():
        events.append("warm")
        for _ in range(5):
            gpu.launch("read_warm", 999_000)

    def probe():
        units = tuple(Unit("_read_floor", name, run=(lambda n=name, d=d: (events.append(n), gpu.launch(n, d))))
                      for name, d in durations.items())
        return ReadProbe(units, 2**30, "fake read", warm)
    info = GpuInfo(H100, 0, "GPU-x", "9.0", 132, 50 * 2**20, 80 * 2**30, "580", "13.0", 1980, 2619)
    return TimingBackend(device=torch.device("cpu"), timer=KernelRecordTimer(lambda cap: FakeTracer(gpu)),
                         flush=lambda: gpu.launch("flush_reduce", 50_000), flush_bytes=256 * 2**20,
                         sync=lambda: None, gpu=info, probe=probe)


def test_measure_reads_every_layout_after_the_warm_up_and_keeps_the_best():
    gpu, events = FakeGpu(), []
    backend = _backend(gpu, events, {"8x256x4": 360_000, "4x256x8": 330_000})
    unit = Unit("T8", "arm", run=lambda: gpu.launch("arm_kernel", 5_000))
    m = measure([unit], TimingProtocol(rounds=1, samples=2, warmup=0), backend)
    assert events[0] == "warm" and "8x256x4" in events and "4x256x8" in events
    floor = m.read_floor
    assert floor.config == "4x256x8" and floor.method == "fake read"
    assert floor.bytes_per_s == pytest.approx(2**30 / 330e-6) == m.read_bandwidth_bytes_per_s
    assert floor.configs["8x256x4"] == pytest.approx(2**30 / 360e-6)
    assert floor.samples == 20 and floor.datasheet_bytes_per_s == 3.35e12
    # the burst's kernels are in no sample, the run's own or the probe's
    assert m.audit.passed and all(k.name != "read_warm" for s in m.samples for k in s.kernels)


def test_the_floor_is_saved_with_the_gpu_and_a_version_1_file_still_loads(tmp_path):
    gpu, events = FakeGpu(), []
    backend = _backend(gpu, events, {"8x256x4": 340_000})
    m = measure([Unit("T8", "arm", run=lambda: gpu.launch("arm_kernel", 5_000))],
                TimingProtocol(rounds=1, samples=2, warmup=0), backend)
    result = make_result()
    gpu_info = replace(result.provenance.gpu, read_bandwidth_bytes_per_s=m.read_bandwidth_bytes_per_s,
                       read_floor=m.read_floor)
    saved = replace(result, provenance=replace(result.provenance, gpu=gpu_info))
    from moebench.analysis.stats import summarize, summary_samples  # its summaries' bandwidth shares follow the new floor
    summaries, _ = summarize(summary_samples(saved), saved.settings.shapes, saved.settings.arms, saved.settings.ref,
                             {f.name: f.floors.hbm_bytes for f in saved.fixtures}, m.read_bandwidth_bytes_per_s)
    saved = replace(saved, summaries=summaries)
    back = loads(dumps(saved))
    assert back.provenance.gpu.read_floor == m.read_floor and back.schema_version == 2
    # the same file as version 1 wrote it: no read_floor, no power limit
    plain = json.loads(dumps(result))
    plain["schema_version"] = 1
    del plain["provenance"]["gpu"]["read_floor"]
    for c in plain["clocks"]:
        del c["power_limit_w"]
    path = tmp_path / "old.json.gz"
    path.write_bytes(gzip.compress(json.dumps(plain).encode()))
    from moebench.analysis.validate import problems
    assert problems(saved) == []
    lying = replace(saved, provenance=replace(saved.provenance, gpu=replace(
        gpu_info, read_floor=replace(m.read_floor, config="nowhere"))))
    assert problems(lying) == [f"read_floor: {m.read_floor.bytes_per_s:g} B/s is not its layout nowhere's rate"]
    old = load(path, trust_stored=True)
    assert old.schema_version == 1 and old.provenance.gpu.read_floor is None
    assert old.provenance.gpu.read_bandwidth_bytes_per_s == result.provenance.gpu.read_bandwidth_bytes_per_s


def test_probe_read_prints_every_layout_and_the_floor(capsys):
    from moebench.cli.probe_cmd import read_floor_lines
    from moebench.tasks.probe import run_read_floor
    gpu, events = FakeGpu(), []
    floor = run_read_floor(samples=4, backend=_backend(gpu, events, {"8x256x4": 360_000, "2x512x8": 330_000}))
    assert floor.config == "2x512x8" and floor.samples == 4 and events[0] == "warm"
    lines = read_floor_lines(floor)
    assert lines[0].startswith(f"read floor: {2**30 / 330e-6 / 1e12:.3f} TB/s, layout 2x512x8")
    assert lines[1].strip().startswith("2x512x8:") and lines[1].endswith("<- the floor")
    assert lines[2].strip().startswith("8x256x4:") and lines[-1].startswith("datasheet 3.35 TB/s")
    with pytest.raises(UserError, match="--op read needs a timer"):
        run_read_floor(timer="none")
    with pytest.raises(UserError, match="--samples must be 2 to"):
        run_read_floor(samples=1)


cuda_core = pytest.importorskip("cuda.core")


def test_the_read_kernel_compiles_for_sm90a_without_spills(tmp_path, monkeypatch):
    from moebench.kernels.cuda import nvrtc as cuda_build
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    m = cuda_build.compile_source("sm90_read_probe.cu")
    assert m.build.arch == "sm_90a"
    assert set(m.build.resources) == {c.kernel for c in READ_CONFIGS}
    for name, r in m.build.resources.items():
        assert r.spill_stores == r.spill_loads == r.stack_bytes == 0, (name, r)
    # the launch bounds hold each instance to the registers its layouts' occupancy needs
    for c in READ_CONFIGS:
        assert m.build.resources[c.kernel].registers * c.threads * c.ctas_per_sm <= 65536, c.name
    cuda_build.clear_memo()
