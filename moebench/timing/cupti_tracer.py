"""The CUPTI I/O: activity tracing through cupti-python, nothing else.

Enabled: CONCURRENT_KERNEL (kernel records: name, start, end, correlation id; does not
serialize kernels), EXTERNAL_CORRELATION, and DRIVER + RUNTIME API records, which must be
on for external-correlation records to exist (Triton and cuda.core launch through the
driver, torch ops through the runtime; H200.md). The API records are filtered down to the
launch calls: every other API's records are switched off, which keeps the per-call
overhead and the record count small.

Per sample the engine calls `begin(id)` (push the external id) and `end(id)` (pop); per
round it synchronizes the device and calls `collect()`, which forces a flush and returns
the parsed records plus the count of records CUPTI dropped. Parsing lives in records.py.

Uses only cupti-python calls present in 13.0.1 (the H200's): activity_enable/disable,
activity_enable_driver_api/runtime_api, activity_register_callbacks, activity_flush_all,
activity_push/pop_external_correlation_id, activity_get_num_dropped_records.
"""

from __future__ import annotations

import ctypes
import re
import threading

from moebench.errors import UserError
from moebench.failures import cupti_failure
from moebench.timing.records import ActivityKinds, RecordBatch, parse_activities

BUFFER_BYTES = 16 * 2**20
LAUNCH_CBID = re.compile(r"Launch")  # cuLaunchKernel(Ex), cudaLaunchKernel(ExC), cuGraphLaunch, ...

_state = threading.Lock()
_registered = False
_active: CuptiTracer | None = None


def load_cupti():
    """The cupti.cupti module, or a UserError saying why it cannot be used."""
    try:
        from cupti import cupti
    except Exception as err:  # ImportError, or a missing libcupti behind it
        raise UserError(f"CUPTI is unavailable ({type(err).__name__}: {err}); install cupti-python "
                        "matching the CUDA driver, or time with --timer events") from None
    return cupti


def _no_callback(*args) -> None:
    pass


def _buffer_requested():
    return BUFFER_BYTES, 0  # 0: no limit on records per buffer


def _buffer_completed(activities):
    tracer = _active
    if tracer is None:
        return
    with tracer._lock:
        parse_activities(activities, tracer.kinds, tracer._batch)


def launch_cbids(members: dict[str, int]) -> set[int]:
    """The callback ids (values of a cbid enum's members) of launch calls."""
    return {int(v) for name, v in members.items() if LAUNCH_CBID.search(name)}


class CuptiTracer:
    def __init__(self, filter_api: bool = True):
        global _registered, _active
        cupti = load_cupti()
        self.cupti = cupti
        AK = cupti.ActivityKind
        self.kinds = ActivityKinds(kernel=frozenset({int(AK.KERNEL), int(AK.CONCURRENT_KERNEL)}),
                                   external_correlation=int(AK.EXTERNAL_CORRELATION),
                                   api=frozenset({int(AK.DRIVER), int(AK.RUNTIME)}))
        self._ext_kind = int(cupti.ExternalCorrelationKind.CUSTOM0)
        self._enabled = (AK.CONCURRENT_KERNEL, AK.EXTERNAL_CORRELATION, AK.DRIVER, AK.RUNTIME)
        self._lock = threading.Lock()
        self._batch = RecordBatch()
        self._dropped = ctypes.c_size_t(0)
        self.api_filter: str = "off"
        with _state:
            if _active is not None:
                raise RuntimeError("a CUPTI tracer is already active in this process")
            try:
                # Another profiler (ncu, nsys) holds CUPTI's one subscriber slot: say so here, not
                # as missing records later.
                cupti.unsubscribe(cupti.subscribe(_no_callback, None))
                if not _registered:
                    cupti.activity_register_callbacks(_buffer_requested, _buffer_completed)
                    _registered = True
                for kind in self._enabled:
                    cupti.activity_enable(kind)
            except cupti.cuptiError as err:
                self._disable()
                raise cupti_failure(err) from None
            _active = self
        if filter_api:
            self.api_filter = self._filter_api_to_launches()
        self._push = cupti.activity_push_external_correlation_id
        self._pop = cupti.activity_pop_external_correlation_id
        self.collect()  # drop whatever was recorded before tracing started

    def _filter_api_to_launches(self) -> str:
        """Switch off API records of every non-launch call. Returns what was done."""
        c = self.cupti
        off = failed = 0
        for enum_cls, enable in ((c.driver_api_trace_cbid, c.activity_enable_driver_api),
                                 (c.runtime_api_trace_cbid, c.activity_enable_runtime_api)):
            members = {n: int(v) for n, v in enum_cls.__members__.items()
                       if n not in ("INVALID", "SIZE", "FORCE_INT")}
            keep = launch_cbids(members)
            for cbid in sorted(set(members.values()) - keep):
                try:
                    enable(cbid, 0)
                    off += 1
                except Exception:
                    failed += 1
        return f"launch calls only ({off} others off" + (f", {failed} could not be switched off)" if failed else ")")

    # --- hot path --------------------------------------------------------------------
    def begin(self, external_id: int) -> None:
        self._push(self._ext_kind, external_id)

    def end(self, external_id: int) -> None:
        self._pop(self._ext_kind)

    # --- per round -------------------------------------------------------------------
    def collect(self) -> RecordBatch:
        """Flush CUPTI's buffers (after the caller synchronized the device) and return
        the records delivered since the last collect, with the dropped-record count."""
        self.cupti.activity_flush_all(int(self.cupti.ActivityFlag.FLUSH_FORCED))
        with self._lock:
            batch, self._batch = self._batch, RecordBatch()
        batch.dropped += self._dropped_since_last()
        return batch

    def _dropped_since_last(self) -> int:
        self._dropped.value = 0
        try:
            self.cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(self._dropped))
        except Exception:
            return 0
        return int(self._dropped.value)

    def close(self) -> None:
        global _active
        try:
            self.cupti.activity_flush_all(int(self.cupti.ActivityFlag.FLUSH_FORCED))
        finally:
            self._disable()
            with _state:
                if _active is self:
                    _active = None

    def _disable(self) -> None:
        for kind in self._enabled:
            try:
                self.cupti.activity_disable(kind)
            except Exception:
                pass
        for enum_cls, enable in ((self.cupti.driver_api_trace_cbid, self.cupti.activity_enable_driver_api),
                                 (self.cupti.runtime_api_trace_cbid, self.cupti.activity_enable_runtime_api)):
            if self.api_filter == "off":
                break
            for n, v in enum_cls.__members__.items():  # restore the default: all on
                if n not in ("INVALID", "SIZE", "FORCE_INT"):
                    try:
                        enable(int(v), 1)
                    except Exception:
                        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
