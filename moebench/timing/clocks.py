"""SM and memory clocks, temperature, power and throttling through NVML, per round.

The engine samples at a round's start and at its end (`over_round` joins the two): the SM
clock at both ends, and NVML's clock-event reasons (the GPU capping its clocks for power or
heat) at both. A round whose SM clock moved or that saw such an event is `throttled`
(ClockSample.throttled); compare's policy on such rounds is moebench.analysis.throttle's.

Degrades to None fields (never an error) when NVML or a query is unavailable: clocks are
provenance, not the measurement.
"""

from __future__ import annotations

from dataclasses import replace

from moebench.record.schema import ClockSample

# NVML's clocks-event (throttle) reason bits that mean the clocks were held down. Left out:
# 0x1 GPU idle (every sample after a sync), 0x2 application clocks setting and 0x100 display
# clock setting (configuration, not an event).
CLOCK_EVENTS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def event_names(mask: int | None) -> tuple[str, ...]:
    """The clock events set in an NVML reasons bitmask, in bit order."""
    if not mask:
        return ()
    return tuple(name for bit, name in sorted(CLOCK_EVENTS.items()) if mask & bit)


def over_round(start: ClockSample, end: ClockSample) -> ClockSample:
    """The round's record: `end`'s readings, `start`'s SM clock, the events seen at either."""
    events = tuple(n for n in CLOCK_EVENTS.values() if n in start.events or n in end.events)
    return replace(end, sm_mhz_start=start.sm_mhz, events=events)


class ClockSampler:
    def __init__(self, uuid: str | None = None, index: int = 0):
        self.handle = None
        self.error: str | None = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            handle = None
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
                except pynvml.NVMLError:
                    handle = None
            self.handle = handle if handle is not None else pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:  # no library, no driver, no device: report, do not fail
            self.error = f"{type(err).__name__}: {err}"

    def _query(self, fn, *args):
        if self.handle is None:
            return None
        try:
            return fn(self.handle, *args)
        except Exception:
            return None

    def sample(self, round_: int) -> ClockSample:
        if self.handle is None:
            return ClockSample(round_, None, None, None, None)
        nv = self._nvml
        power_mw = self._query(nv.nvmlDeviceGetPowerUsage)
        limit_mw = self._query(nv.nvmlDeviceGetEnforcedPowerLimit)
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        return ClockSample(
            round=round_,
            sm_mhz=self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            mem_mhz=self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            temperature_c=self._query(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000.0,
            events=event_names(self._query(reasons) if reasons else None),
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
        )

    def max_clocks_mhz(self) -> tuple[int | None, int | None]:
        if self.handle is None:
            return None, None
        nv = self._nvml
        return (self._query(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM),
                self._query(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_MEM))

    def driver_version(self) -> str | None:
        if self.handle is None:
            return None
        try:
            v = self._nvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:
            return None
