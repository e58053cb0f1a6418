"""The checks `verify` makes, as a RunResult of their own (`moebench verify [--determinism] --out`):
determinism verdicts, or parity rows against the oracle.

The file has the run's provenance, the fixtures and the checks, and no samples: its timer is
"none" and its rounds and samples 0, so `report` shows the checks alone and `load` checks
them (moebench.analysis.validate). A timed run's RunResult carries the same records.
"""

from __future__ import annotations

import dataclasses

import torch

from moebench.fixtures import Fixture
from moebench.fixtures.summary import fixture_summary
from moebench.record import schema as S
from moebench.record.determinism import DeterminismVerdict
from moebench.record.provenance import gpu_info, provenance


def fixture_info(fx: Fixture) -> S.FixtureInfo:
    summary = fixture_summary(fx)
    return S.from_plain(S.FixtureInfo, {f.name: summary[f.name] for f in dataclasses.fields(S.FixtureInfo)})


def determinism_result(verdicts: list[DeterminismVerdict], fixtures: list[Fixture], *, command: list[str],
                       started_at: str, device: torch.device, options: dict | None = None) -> S.RunResult:
    return checks_result([fixture_info(fx) for fx in fixtures], command=command, started_at=started_at,
                         device=device, options=options, determinism=verdicts)


def checks_result(fixtures: list[S.FixtureInfo], *, command: list[str], started_at: str, device: torch.device,
                  options: dict | None = None, determinism: list[DeterminismVerdict] = (),
                  parity: list[S.ParityInfo] = ()) -> S.RunResult:
    """A RunResult of checks alone (no samples): the fixtures they ran on and their records."""
    arms = tuple(dict.fromkeys([v.arm for v in determinism] + [p.arm for p in parity]))
    gpu = gpu_info(device) if device.type == "cuda" else None
    settings = S.Settings(shapes=tuple(f.name for f in fixtures), arms=arms, ref=arms[0], rounds=0,
                          samples=0, warmup=0, flush="none", flush_bytes=0, timer="none",
                          balancedness=fixtures[0].balancedness,
                          options={k: v for k, v in (options or {}).items() if v is not None})
    return S.RunResult(
        schema_version=S.SCHEMA_VERSION, provenance=provenance(command, started_at, gpu), settings=settings,
        fixtures=tuple(fixtures), arms=(), parity=tuple(parity), samples=(), clocks=(),
        audit=S.Audit(0, 0, 0), summaries=(), ratios=(), determinism=tuple(determinism))
