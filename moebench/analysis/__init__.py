"""Analysis: what the samples say. Statistics (medians, intervals, placements), significance
tests, verdicts and ratio verdicts against the noise floor, floors and rooflines, throttling, the
comparison of two runs, and the check of a saved result against its own samples (`load`).
Imports the record and the timing stage's sample rules, nothing above."""
