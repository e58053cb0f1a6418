"""Experiment: time variants of one arm (constructor or config settings) in one paired run.

Each variant is checked against the oracle first; those that pass are timed as callables
of one paired run per shape through `moebench.bench` (same flush, CUPTI records, rounds
and audit as `moebench run`), the first variant the reference.

    python scripts/arm_variants.py OUT_DIR --arm cuda-fused --variant bm8:block_m=8 \\
        --variant bm16:block_m=16 [--shape A8 --shape Q128 ...]

A variant is NAME:KEY=INT[,KEY=INT...]: keyword arguments of the arm's constructor, or,
for an arm with a `config` dataclass (cuda-gemm, cuda-swapab), fields replaced in it.
"""

from __future__ import annotations

import argparse
import dataclasses

import moebench
from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.kernels.registry import make_arm
from moebench.kernels.parity import References, check_parity


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    name, _, body = text.partition(":")
    settings = {}
    for item in filter(None, body.split(",")):
        key, _, value = item.partition("=")
        settings[key] = int(value)
    if not name:
        raise SystemExit(f"bad variant {text!r}: NAME:KEY=INT[,KEY=INT...]")
    return name, settings


def make_variant(arm_name: str, settings: dict[str, int]):
    arm = make_arm(arm_name)
    if dataclasses.is_dataclass(getattr(arm, "config", None)):
        arm.config = dataclasses.replace(arm.config, **settings)
    elif settings:
        arm = type(arm)(**settings)
    return arm


def time_variants(shape: str, arms: dict, out_dir: str):
    """Oracle-check every arm of `arms` (name -> Arm) on `shape`, then time those that pass
    in one paired run; prints and returns the RunResult."""
    fx = build_fixture(ShapeRegistry().resolve(shape)).to("cuda")
    refs = References(fx)
    calls = {}
    for name, arm in arms.items():
        call = arm.prepare(fx)
        parity = check_parity(call, refs, shape)
        launch = {k: call.identity[k] for k in ("cluster", "ctas_per_sm", "stages", "clusters", "registers")
                  if k in call.identity}
        print(f"{shape} {name}: rel L2 {parity.rel_l2:.2e} {'ok' if parity.passed else 'FAIL'}; "
              f"{call.identity.get('grids') or call.identity.get('grid')} {launch}", flush=True)
        if parity.passed:
            calls[name] = call
    result = moebench.bench({k: c.run for k, c in calls.items()},
                            kernels={k: c.kernels for k, c in calls.items()}, label=shape,
                            hbm_bytes=fx.floors().hbm_bytes, out_dir=out_dir)
    ref = next(iter(calls))
    for r in result.ratios:
        s = next(x for x in result.summaries if x.arm == r.arm)
        print(f"{shape} {r.arm}: {s.median_ns / 1e3:.2f} us, {ref}/{r.arm} = {r.median:.3f} "
              f"({r.low:.3f}-{r.high:.3f}, {r.rounds_won}/{r.rounds})", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--arm", required=True)
    ap.add_argument("--variant", action="append", required=True, type=parse_variant)
    ap.add_argument("--shape", action="append")
    args = ap.parse_args()
    for shape in args.shape or ["A8", "A128", "Q8", "Q128"]:
        time_variants(shape, {name: make_variant(args.arm, s) for name, s in args.variant}, args.out_dir)


if __name__ == "__main__":
    main()
