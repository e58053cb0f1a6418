"""The A/A proof on a GPU: does `compare` call identical code the same, and a small injected
slowdown slower, across separate runs?

    python scripts/aa_proof.py --out results/h200/aa [--pairs 20] [--shapes A8,Q8]

1. One noise run: `run --aa fused` (the arm and a second prepared copy, paired), which
   measures the floor per shape.
2. For each pair i: three separate runs, each with its own prepare (fixture copied to the GPU
   anew, arm prepared anew) and each carrying the floor (`--noise-from`): A_i and B_i of
   `fused` (scripts/aa_arms.py: cuda-fused as shipped), S_i of `fused` with the injected
   slowdown (the same label, so compare pairs them).
3. `compare A_i B_i` must say SAME, `compare A_i S_i` SLOWER, per shape, by the default rules.

The runs go in one process through moebench's own library calls (the RunRequest a `moebench
run` command makes, and compare_results), so that 3 x 20 runs fit in minutes: the CPU fixture
is generated once per shape and every run copies it to the GPU itself. Each run's file is kept;
the summary (summary.md) counts the verdicts and gives the change compare measured.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter, defaultdict
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from moebench.run import prepare as prepare_stage  # noqa: E402
from moebench.run.plan import RunRequest  # noqa: E402
from moebench.analysis.compare import compare_results  # noqa: E402
from moebench.analysis.verdicts import Verdict  # noqa: E402
from moebench.run.runner import run  # noqa: E402

PLAIN, SLOW = "fused=scripts.aa_arms:fused", "fused=scripts.aa_arms:fused_slow"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--shapes", default="A8,Q8")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--samples", type=int, default=10)
    args = ap.parse_args(argv)
    out = Path(args.out)
    shapes = tuple(s for s in args.shapes.split(",") if s)
    # one CPU fixture per shape; every run still copies it to the device on its own
    prepare_stage.build_fixture = functools.lru_cache(maxsize=None)(prepare_stage.build_fixture)

    def one(kind: str, i: int, external: str, **extra):
        req = RunRequest(shapes=shapes, arms=(), external_arms=(external,), rounds=args.rounds, samples=args.samples,
                         out_dir=str(out / kind), measure_bandwidth=False,
                         command=("scripts/aa_proof.py", kind, str(i)), **extra)
        result, path = run(req)
        print(f"{kind} {i}: {path.name} audit {result.audit.samples_passed}/{result.audit.samples_total}", flush=True)
        return result, path

    noise, noise_path = one("noise", 0, PLAIN, aa_arm="fused")
    print("floors:", {s: f"{v['fused']:.2%}" for s, v in noise.noise.items()}, flush=True)
    verdicts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    changes: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i in range(1, args.pairs + 1):
        a, _ = one("a", i, PLAIN, noise_from=str(noise_path))
        b, _ = one("b", i, PLAIN, noise_from=str(noise_path))
        s, _ = one("slow", i, SLOW, noise_from=str(noise_path))
        for kind, other in (("A/A", b), ("injected", s)):
            for c in compare_results(a, other, a_label=f"a{i}", b_label=f"{kind}{i}").arms:
                verdicts[(c.shape, kind)][c.verdict] += 1
                changes[(c.shape, kind)].append(c.change)
    lines = ["| shape | pairs | noise floor | A/A: same | A/A: other verdicts | A/A median change | "
             "injected: slower | injected: other verdicts | injected median change |",
             "|---|--:|--:|--:|---|--:|--:|---|--:|"]
    for shape in shapes:
        aa, inj = verdicts[(shape, "A/A")], verdicts[(shape, "injected")]
        others = lambda c, v: ", ".join(f"{k.value} {n}" for k, n in c.items() if k is not v) or "—"  # noqa: E731
        lines.append(f"| {shape} | {args.pairs} | ±{noise.noise.get(shape, {}).get('fused', float('nan')):.2%} | "
                     f"{aa[Verdict.SAME]} | {others(aa, Verdict.SAME)} | {median(changes[(shape, 'A/A')]):+.2%} | "
                     f"{inj[Verdict.SLOWER]} | {others(inj, Verdict.SLOWER)} | "
                     f"{median(changes[(shape, 'injected')]):+.2%} |")
    passed = all(verdicts[(s, "A/A")][Verdict.SAME] >= args.pairs - 1 and
                 verdicts[(s, "injected")][Verdict.SLOWER] >= args.pairs - 1 for s in shapes)
    text = "\n".join(lines) + f"\n\n{'PASS' if passed else 'FAIL'}: SAME and SLOWER each needed in at least " \
                              f"{args.pairs - 1} of {args.pairs} pairs per shape.\n"
    (out / "summary.md").write_text(text)
    print(text)
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
