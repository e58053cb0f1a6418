"""SM and memory clocks, temperature and power through NVML, once per round.

Degrades to None fields (never an error) when NVML or a query is unavailable: clocks are
provenance, not the measurement.
"""

from __future__ import annotations

from moebench.results.schema import ClockSample


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
        return ClockSample(
            round=round_,
            sm_mhz=self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            mem_mhz=self._query(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            temperature_c=self._query(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000.0,
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
