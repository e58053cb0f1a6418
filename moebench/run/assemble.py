"""A Measurement and what was timed, assembled into a RunResult; and its file name.

Statistics are taken over the samples the audit passed only; every sample is kept in the
result, with the audit that judged it, so the statistics can be redone from the file.
"""

from __future__ import annotations

import re
from dataclasses import replace

from moebench.analysis.stats import summarize
from moebench.record import schema as S
from moebench.record.metrics import timed_metric
from moebench.record.provenance import provenance
from moebench.run.prepare import Subjects
from moebench.timing.measure import Measurement


def assemble(m: Measurement, subjects: Subjects, *, gpu: S.GpuInfo | None, command: tuple[str, ...],
             started_at: str, options: dict | None = None, status: S.RunStatus | None = None) -> S.RunResult:
    """The RunResult of measurement `m` of `subjects`; `options` are the request's own settings
    (arm options, builds, variants) to store beside the timer's; `status` says whether the
    run is finished (moebench.run.partial: a run saves itself after every round)."""
    p = m.protocol
    # The share of the read bandwidth only where the file keeps that bandwidth (with its GPU), so
    # a reader can redo it.
    summaries, ratios = summarize(m.audited_samples, subjects.shapes, subjects.arms, subjects.ref,
                                  subjects.hbm_bytes, m.read_bandwidth_bytes_per_s if gpu is not None else None)
    if gpu is not None:
        gpu = replace(gpu, read_bandwidth_bytes_per_s=m.read_bandwidth_bytes_per_s, read_floor=m.read_floor)
    settings = S.Settings(shapes=subjects.shapes, arms=subjects.arms, ref=subjects.ref, rounds=p.rounds,
                          samples=p.samples, warmup=p.warmup, flush=p.flush, flush_bytes=m.flush_bytes,
                          timer=m.timer, balancedness=subjects.balancedness,
                          options={k: v for k, v in {**(options or {}), **m.timer_settings}.items() if v is not None},
                          sampler=p.sampler, placements=p.placements, placement_mode=p.placement_mode,
                          placements_by_shape=dict(subjects.placements), order_seed=p.order_seed)
    return S.RunResult(
        schema_version=S.SCHEMA_VERSION, provenance=provenance(command, started_at, gpu), settings=settings,
        fixtures=subjects.fixtures, arms=subjects.arm_infos, parity=subjects.parity, samples=m.samples,
        clocks=m.clocks, audit=m.audit, summaries=summaries, ratios=ratios, build_parity=subjects.build_parity,
        statistics_over=S.AUDITED_SAMPLES, determinism=subjects.determinism,
        status=status or S.RunStatus(),  # complete (a dry-run cell has no rounds to count)
    )


def result_filename(result: S.RunResult) -> str:
    """`20261129T101500Z_A8-A128_triton-vs-triton-swapab.json`, plus the timer and flush
    when they are not the defaults."""
    s = result.settings
    stamp = re.sub(r"[-:]", "", result.provenance.started_at)
    parts = [stamp, "-".join(s.shapes), "-vs-".join(s.arms)]
    metric = timed_metric(s.timer)
    if not metric.reference:
        parts.append(metric.short)
    if s.flush != "read":
        parts.append(f"flush-{s.flush}")
    if s.sampler != "eager":
        parts.append(s.sampler)
    return re.sub(r"[^A-Za-z0-9._-]", "_", "_".join(parts)) + ".json"
