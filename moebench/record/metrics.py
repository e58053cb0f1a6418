"""What a timer's samples measure, declared once per timer: the views format by these
declarations and never ask which timer ran.

A RunResult stores the name of the timer that ran (`settings.timer`); `timed_metric` turns
that name into its declaration. A name this version does not know still gets one, that says
only what the file says.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimedMetric:
    """The headline value of every sample a timer makes, and what can be said of it."""

    name: str  # the metric's name in CSV rows and plots ("gpu_busy")
    unit: str  # "ns"
    source: str  # how the tables' caption says the value was taken
    method: str  # the clause of the Markdown method sentence
    plot_label: str  # the axis label of duration plots
    kernels_visible: bool  # samples hold their kernel records: spans, per-kernel times, kernel audit
    reference: bool  # the timing DESIGN names as the measurement (others carry a warning)
    short: str = ""  # a tag for headings and file names when not the reference ("events")


KERNEL_RECORDS = TimedMetric(
    name="gpu_busy", unit="ns",
    source="CUPTI kernel records, gpu_busy (union of the call's kernels; = gpu_sum without PDL overlap)",
    method=("timed as the GPU time of its kernels from CUPTI records (gpu_busy: the union of their "
            "intervals, the sum of their durations where they do not overlap)"),
    plot_label="GPU time (kernels, CUPTI)", kernels_visible=True, reference=True)

EVENT_INTERVALS = TimedMetric(
    name="events", unit="ns", source="CUDA EVENTS (not CUPTI), event interval",
    method="timed with CUDA events around the call (not CUPTI: launch gaps included)",
    plot_label="time (CUDA events)", kernels_visible=False, reference=False, short="events")

UNTIMED = TimedMetric(
    name="none", unit="ns", source="untimed (an outside profiler measures)",
    method="not timed (launched for an outside profiler)", plot_label="(untimed)",
    kernels_visible=False, reference=False, short="none")

METRICS: dict[str, TimedMetric] = {"cupti": KERNEL_RECORDS, "events": EVENT_INTERVALS, "none": UNTIMED}


def timed_metric(timer: str) -> TimedMetric:
    """The declaration of the timer named `timer` (as a RunResult stores it)."""
    known = METRICS.get(timer)
    if known is not None:
        return known
    return TimedMetric(name=timer, unit="ns", source=f"timer {timer!r}", method=f"timed by {timer!r}",
                       plot_label=f"time ({timer})", kernels_visible=False, reference=False, short=timer)
