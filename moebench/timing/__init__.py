"""Timing: the L2 flush, the CUPTI tracer and the other timers, clock sampling, the paired-round
schedule, the sample audit, the HBM read floor, and `measure`, which times prepared units by a
protocol."""
