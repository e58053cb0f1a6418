"""CuptiTracer's I/O code against a stand-in `cupti` module with the 13.0.1 call names:
enabling, API filtering to launch calls, push/pop, flush, dropped-record counting."""

import ctypes
import enum
import sys
import types
from types import SimpleNamespace as NS

import pytest


class FakeCupti(types.ModuleType):
    def __init__(self):
        super().__init__("cupti.cupti")
        self.ActivityKind = enum.IntEnum("ActivityKind", {"KERNEL": 3, "CONCURRENT_KERNEL": 10, "DRIVER": 5,
                                                           "RUNTIME": 6, "EXTERNAL_CORRELATION": 24})
        self.ExternalCorrelationKind = enum.IntEnum("ExternalCorrelationKind", {"INVALID": 0, "UNKNOWN": 1,
                                                                                 "CUSTOM0": 4})
        self.ActivityFlag = enum.IntEnum("ActivityFlag", {"NONE": 0, "FLUSH_FORCED": 1})
        self.driver_api_trace_cbid = enum.IntEnum("driver_api_trace_cbid", {
            "INVALID": 0, "cuMemcpy": 1, "cuLaunchKernel": 307, "cuLaunchKernelEx": 652, "SIZE": 800})
        self.runtime_api_trace_cbid = enum.IntEnum("runtime_api_trace_cbid", {
            "INVALID": 0, "cudaMalloc_v3020": 20, "_runtime_api_trace_cbid__cudaLaunchKernel_v13000": 211})
        self.cuptiError = type("cuptiError", (Exception,), {})
        self.enabled, self.api_off, self.stack, self.pending, self.callbacks = set(), set(), [], [], None
        self.drop_next = 0
        self.subscribers, self.taken_by = 0, None  # taken_by: CUPTI's error when a profiler holds it

    def subscribe(self, callback, userdata):
        if self.taken_by is not None:
            raise self.cuptiError(self.taken_by)
        self.subscribers += 1
        return 1

    def unsubscribe(self, handle):
        self.subscribers -= 1

    def activity_register_callbacks(self, req, done):
        assert req() [0] > 0
        self.callbacks = (req, done)

    def activity_enable(self, kind):
        self.enabled.add(int(kind))

    def activity_disable(self, kind):
        self.enabled.discard(int(kind))

    def activity_enable_driver_api(self, cbid, enable):
        (self.api_off.discard if enable else self.api_off.add)(("drv", cbid))

    def activity_enable_runtime_api(self, cbid, enable):
        (self.api_off.discard if enable else self.api_off.add)(("rt", cbid))

    def activity_push_external_correlation_id(self, kind, id_):
        assert kind == 4
        self.stack.append(id_)

    def activity_pop_external_correlation_id(self, kind):
        return self.stack.pop()

    def activity_flush_all(self, flag):
        acts, self.pending = self.pending, []
        self.callbacks[1](acts)

    def activity_get_num_dropped_records(self, ctx, stream, ptr):
        ctypes.c_size_t.from_address(ptr).value = self.drop_next
        self.drop_next = 0

    # the fake "GPU": a launch makes an API record, maybe an external record, a kernel record
    def launch(self, name, corr, start, end):
        self.pending.append(NS(kind=5, cbid=307, correlation_id=corr))
        if self.stack:
            self.pending.append(NS(kind=24, correlation_id=corr, external_id=self.stack[-1], external_kind=4))
        self.pending.append(NS(kind=10, name=name, start=start, end=end, correlation_id=corr, stream_id=7))


@pytest.fixture
def fake_cupti(monkeypatch):
    fake = FakeCupti()
    pkg = types.ModuleType("cupti")
    pkg.cupti = fake
    monkeypatch.setitem(sys.modules, "cupti", pkg)
    monkeypatch.setitem(sys.modules, "cupti.cupti", fake)
    import moebench.timing.cupti_tracer as ct
    monkeypatch.setattr(ct, "_registered", False)
    monkeypatch.setattr(ct, "_active", None)
    return fake


def test_tracer_enables_filters_tags_and_counts_drops(fake_cupti):
    from moebench.timing.cupti_tracer import CuptiTracer
    from moebench.timing.records import group_by_external_id, tag_kernels
    t = CuptiTracer()
    assert fake_cupti.enabled == {10, 5, 6, 24}
    assert fake_cupti.api_off == {("drv", 1), ("rt", 20)}  # everything but the launch calls
    assert t.api_filter.startswith("launch calls only")
    fake_cupti.launch("flush", 1, 0, 10)
    t.begin(42)
    fake_cupti.launch("gemm", 2, 20, 30)
    t.end(42)
    fake_cupti.drop_next = 2
    batch = t.collect()
    assert batch.dropped == 2 and batch.api_records == 2
    groups = group_by_external_id(tag_kernels(batch))
    assert [k.name for k in groups[42]] == ["gemm"]
    with pytest.raises(RuntimeError, match="already active"):
        CuptiTracer()
    t.close()
    assert fake_cupti.enabled == set() and fake_cupti.api_off == set()
    CuptiTracer().close()  # a second tracer in the same process: callbacks registered once


def test_cupti_missing_is_one_clear_user_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupti", None)
    from moebench.errors import UserError
    from moebench.timing.cupti_tracer import load_cupti
    with pytest.raises(UserError, match="CUPTI is unavailable.*--timer events"):
        load_cupti()


@pytest.mark.parametrize("status, needle", [
    ("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)", "another profiler holds CUPTI (ncu, nsys"),
    ("ERROR_INSUFFICIENT_PRIVILEGES (35)", "NVreg_RestrictProfilingToAdminUsers=0"),
])
def test_cupti_taken_or_forbidden_is_one_line_before_any_tracing(fake_cupti, status, needle):
    from moebench.errors import UserError
    from moebench.timing.cupti_tracer import CuptiTracer
    fake_cupti.taken_by = status
    with pytest.raises(UserError) as err:
        CuptiTracer()
    text = str(err.value)
    assert needle in text and status in text and "--timer events" in text and "\n" not in text
    assert fake_cupti.enabled == set() and fake_cupti.subscribers == 0
    fake_cupti.taken_by = None  # the profiler gone, tracing starts and leaves no subscriber behind
    CuptiTracer().close()
    assert fake_cupti.subscribers == 0
