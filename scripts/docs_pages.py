"""Regenerate the result pages under docs/ (one folder per GPU: docs/h200/, docs/h100/) and the
generated sections of README.md and the docs pages, from the runs committed under results/.

Every number in those sections is printed by `moebench report` / `moebench compare` from a
RunResult under results/, or read from one here; nothing is typed by hand. Each section sits
between `<!-- moebench:NAME -->` and `<!-- /moebench:NAME -->` in one of PAGES. The README's
headline table is `moebench report results/h200/all-arms.json --format pr`, its table alone.

    python scripts/docs_pages.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "h200"

# Pages with generated sections; each section's markers are in exactly one of them.
PAGES = ("README.md", "docs/h200/results.md", "docs/h100/results.md", "docs/measurement.md",
         "docs/determinism.md", "docs/usage.md")

# Per GPU, the runs with a full report page (and plots) under docs/<gpu>/.
REPORTS = {
    "h200": {"all-arms": "all-arms.json", "stock-referee": "stock-referee.json",
             "sweep-A": "sweep-A.json.gz", "sweep-Q": "sweep-Q.json.gz",
             "sweep-fused-A": "sweep-fused-A.json.gz", "sweep-fused-Q": "sweep-fused-Q.json.gz"},
    "h100": {"sweep-fused-A": "sweep-fused-A.json.gz", "sweep-fused-Q": "sweep-fused-Q.json.gz"},
}


# Runs whose ratios the pages take against another arm than the run's reference (recomputed from
# the paired samples): the fused sweeps read against the engine-faithful stock arm.
REPORT_REF = {"sweep-fused-A": ("--ref", "triton"), "sweep-fused-Q": ("--ref", "triton")}


def moebench(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "moebench", *args], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    return out.stdout


def flush_table() -> str:
    """Median gpu_sum per shape and arm under each flush mode, from the three flush runs."""
    sys.path.insert(0, str(ROOT))
    from moebench.analysis.load import load

    modes = ["read", "write", "none"]
    runs = {m: load(RESULTS / f"flush-{m}.json.gz") for m in modes}
    medians = {m: {(s.shape, s.arm): s.median_ns for s in r.summaries} for m, r in runs.items()}
    lines = ["| shape | arm | read (cold, clean) µs | write (cold, dirty) µs | none (warm) µs | write / read | none / read |",
             "|---|---|--:|--:|--:|--:|--:|"]
    for key in medians["read"]:
        r, w, n = (medians[m][key] for m in modes)
        lines.append(f"| {key[0]} | `{key[1]}` | {r / 1e3:.2f} | {w / 1e3:.2f} | {n / 1e3:.2f} | "
                     f"{w / r:.3f} | {n / r:.3f} |")
    return "\n".join(lines) + "\n"


def log_lines(name: str, *patterns: str) -> str:
    """Lines of a committed H200 log (results/h200/fidelity/) that match, as a code block."""
    text = (RESULTS / "fidelity" / name).read_text().splitlines()
    keep = [ln for ln in text if any(re.search(p, ln) for p in patterns)]
    return "```\n" + "\n".join(keep) + "\n```\n"


def swapab_sentence() -> str:
    """What Swap-AB alone buys: the paired cuda-gemm / cuda-swapab ratios of the two sweeps."""
    sys.path.insert(0, str(ROOT))
    from moebench.analysis.load import load

    parts = []
    for family in ("A", "Q"):
        r = load(RESULTS / f"sweep-{family}.json.gz")
        rows = [x for x in r.ratios if x.ref == "cuda-gemm" and x.arm == "cuda-swapab"]
        lo, hi = min(rows, key=lambda x: x.median), max(rows, key=lambda x: x.median)
        won = sum(x.rounds_won for x in rows)
        total = sum(x.rounds for x in rows)
        parts.append(f"family {family}: **{lo.median:.2f}× ({lo.shape}) to {hi.median:.2f}× ({hi.shape})**, "
                     f"won {won} of {total} paired rounds")
    return ("Swap-AB alone makes the grouped GEMM path faster at every M from 1 to 256: "
            + "; ".join(parts) + ".\n")


FUSED_TARGETS = {"A8": (1.5, 1.5), "Q8": (1.5, 1.5), "A128": (1.25, None), "Q128": (1.25, None)}


def fused_table() -> str:
    """cuda-fused's bars, read off the all-arms run: time over the HBM floor (at the run's
    measured read bandwidth), speed-up over the engine-faithful triton, and the fastest other arm."""
    sys.path.insert(0, str(ROOT))
    from moebench.analysis.roofline import UNDERSTATED, arm_floor
    from moebench.analysis.load import load

    r = load(RESULTS / "all-arms.json")
    by = {(x.shape, x.arm): x for x in r.summaries}
    ratio = {(x.shape, x.arm): x for x in r.ratios}
    lines = ["| shape | cuda-fused µs | time / HBM floor (bar) | vs triton (bar) | fastest other arm | bars met |",
             "|---|--:|--:|--:|---|---|"]
    for shape in r.settings.shapes:
        fused = by[(shape, "cuda-fused")]
        standing = arm_floor(fused, None)
        over_floor = 1 / standing.read_share
        flag = f" ({UNDERSTATED})" if standing.share_understated else ""  # beat the floor: it was too low
        floor_bar, speed_bar = FUSED_TARGETS[shape]
        vs_triton = ratio[(shape, "cuda-fused")].median
        other = min((x for x in r.summaries if x.shape == shape and x.arm != "cuda-fused"),
                    key=lambda x: x.median_ns)
        met = [over_floor <= floor_bar, fused.median_ns < other.median_ns]
        if speed_bar:
            met.append(vs_triton >= speed_bar)
        lines.append(f"| {shape} | {fused.median_ns / 1e3:.2f} | {over_floor:.2f}×{flag} (≤ {floor_bar}×) | "
                     f"{vs_triton:.2f}×" + (f" (≥ {speed_bar}×)" if speed_bar else "") +
                     f" | `{other.arm}` {other.median_ns / 1e3:.2f} µs | {sum(met)} of {len(met)} |")
    return "\n".join(lines) + "\n"


def fused_every_m(results: Path = RESULTS) -> str:
    """cuda-fused against the fused path's targets over the two M sweeps under `results`: where it is the
    fastest arm, its lead over the best stock arm at M <= 256, and its share of the FP8 peak at M >= 4096."""
    sys.path.insert(0, str(ROOT))
    from moebench.analysis.roofline import shape_floors
    from moebench.analysis.load import load

    lines = ["| family | fastest arm at | cuda-swapab's kernels (a tie) at | slower than another arm at | "
             "vs `triton` at M ≤ 256 | share of dense FP8 peak at M ≥ 4096 |", "|---|---|---|---|--:|--:|"]
    for family in ("A", "Q"):
        r = load(results / f"sweep-fused-{family}.json.gz")
        by = {(x.shape, x.arm): x.median_ns for x in r.summaries}
        ms = {f.name: f.M for f in r.fixtures}
        floors = shape_floors(r)
        paths = {a.shape: a.identity.get("path") for a in r.arms if a.name == "cuda-fused"}
        won, tied, lost, lead, share = [], [], [], [], []
        for shape in r.settings.shapes:
            fused = by[(shape, "cuda-fused")]
            other_arm, other = min(((a, t) for (sh, a), t in by.items() if sh == shape and a != "cuda-fused"),
                                   key=lambda x: x[1])
            if paths[shape] == "grouped":
                tied.append(f"{shape} ({fused / 1e3:.1f} against {by[(shape, 'cuda-swapab')] / 1e3:.1f} µs)")
            elif fused < other:
                won.append(shape)
            else:
                lost.append(f"{shape} ({paths[shape]}: {fused / 1e3:.1f} against `{other_arm}` {other / 1e3:.1f} µs)")
            if ms[shape] <= 256:
                lead.append(by[(shape, "triton")] / fused)
            fl = floors[shape].fp8_floor_ns
            if ms[shape] >= 4096 and fl:
                share.append(fl / fused)
        lines.append(f"| {family} | {len(won)} of {len(r.settings.shapes)} M | {', '.join(tied) or '—'} | "
                     f"{', '.join(lost) or '—'} | {min(lead):.2f}× to {max(lead):.2f}× | "
                     f"{min(share):.1%} to {max(share):.1%} |")
    return "\n".join(lines) + "\n"


def placement_table() -> str:
    """Per-kernel ratios at A1 from three runs: triton against a second copy of itself, and
    against the referee prepared after it and before it (the kernels of a sample in launch order)."""
    sys.path.insert(0, str(ROOT))
    from collections import defaultdict
    from statistics import median

    from moebench.analysis.load import load

    order = ["gemm1", "silu_and_mul", "act_quant", "gemm2", "combine"]
    runs = [("`triton#2` / `triton` (A/A)", "stock-A1-aa-triton.json", "triton#2", "triton"),
            ("`triton` / `sglang`, `triton` prepared first", "stock-referee-A1-rounds12.json", "triton", "sglang"),
            ("`triton` / `sglang`, `sglang` prepared first", "stock-referee-A1-reversed.json", "triton", "sglang")]
    lines = ["| run | call | " + " | ".join(order) + " |", "|---|--:|" + "--:|" * len(order)]
    for title, name, arm, ref in runs:
        r = load(RESULTS / name)
        per = defaultdict(list)  # (arm, round, kernel position) -> durations
        calls = defaultdict(list)
        for smp in r.samples:
            for i, k in enumerate(smp.kernels):
                per[(smp.arm, smp.round, i)].append(k.duration_ns)
            calls[(smp.arm, smp.round)].append(smp.value_ns)
        rounds = sorted({smp.round for smp in r.samples})
        cells = [median(median(calls[(arm, n)]) / median(calls[(ref, n)]) for n in rounds)]
        cells += [median(median(per[(arm, n, i)]) / median(per[(ref, n, i)]) for n in rounds)
                  for i in range(len(order))]
        lines.append(f"| {title} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def placements_rows() -> str:
    """One placement against four (`run --placements`): the A/A pair of cuda-fused and the
    two-accumulator walk against the kernel before it, on an H100, read off the four runs."""
    sys.path.insert(0, str(ROOT))
    from moebench.analysis.load import load
    from moebench.analysis.stats import placement_summaries

    exp = ROOT / "results" / "h100" / "experiments"
    runs = [("`--aa cuda-fused`, 8 rounds (`placements-aa-one.json.gz`)", "placements-aa-one.json.gz", "A8192"),
            ("`--aa cuda-fused`, 8 rounds (`placements-aa-four.json.gz`)", "placements-aa-four.json.gz", "A8192"),
            ("the two-accumulator walk against the kernel before it", "prefill-down-two-acc-placements.json.gz",
             "A8192"),
            ("the same, Q8192", "prefill-down-two-acc-placements.json.gz", "Q8192")]
    lines = ["| run (H100, A8192 unless named) | placements | ratio [range over rounds] | per placement | "
             "each arm's spread |", "|---|--:|--:|--:|--:|"]
    for title, name, shape in runs:
        r = load(exp / name)
        ratio = next(x for x in r.ratios if x.shape == shape)
        places = [p for p in placement_summaries(r) if p.shape == shape]
        per = next((p.ratios for p in places if p.ratios), None)
        lines.append(f"| {title} | {r.settings.placements} | {ratio.median:.3f} [{ratio.low:.3f}, {ratio.high:.3f}] | "
                     f"{' / '.join(f'{x:.3f}' for x in per) if per else '—'} | "
                     f"{', '.join(f'{p.spread:.1%}' for p in places) or '—'} |")
    return "\n".join(lines) + "\n"


def referee_sentence(name: str) -> str:
    """The stock arm against its referee in one committed run, as the Markdown report gives it."""
    sys.path.insert(0, str(ROOT))
    from moebench.views.markdown import referee_markdown
    from moebench.analysis.load import load
    return referee_markdown(load(RESULTS / name)) + "\n"


def determinism_rows() -> str:
    """The determinism verdicts of every arm at the four reference shapes, one table, from the
    four `verify --determinism` files (the rows `report --format markdown` draws for each)."""
    rows = []
    for shape in ("A8", "Q8", "A128", "Q128"):
        text = moebench("report", f"results/h200/determinism-{shape}.json", "--format", "markdown")
        lines = text.splitlines()
        head = next(i for i, ln in enumerate(lines) if ln.startswith("| shape"))
        if not rows:
            rows += lines[head:head + 2]
        rows += [ln for ln in lines[head + 2:] if ln.startswith("| ")]
    return "\n".join(rows) + "\n"


def file_text(name: str) -> str:
    """A Markdown table a moebench command wrote under results/h200/fidelity/, as it is."""
    return (RESULTS / "fidelity" / name).read_text()


def headline() -> str:
    """The README's one table: the pull-request view of the four reference shapes, without its
    collapsed details (the full page is docs/h200/all-arms.md)."""
    text = moebench("report", "results/h200/all-arms.json", "--format", "pr")
    table = [ln for ln in text.split("<details>")[0].splitlines() if ln.startswith("|")]
    return "\n".join(table) + "\n"


def sections() -> dict[str, str]:
    return {
        "headline": headline(),
        "swapab": swapab_sentence(),
        "fused": fused_table(),
        "builds": moebench("report", "results/h200/builds-fused-wt-vs-v1.json", "--format", "summary"),
        "ncu": log_lines("ncu-probe.log", r"^add: median", r"^ncu "),
        "wall": log_lines("wall-1200-samples.log", r"audited", r"^real") + "\n"
                + log_lines("wall-2400-samples.log", r"audited", r"^real"),
        "all-arms": report_summary("all-arms"),
        "stock": report_summary("stock-referee"),
        "stock-no-pdl": referee_sentence("stock-referee-no-pdl.json.gz"),
        "repeat": moebench("compare", "results/h200/all-arms-before-fused-split.json.gz",
                           "results/h200/all-arms-after-fused-split.json.gz",
                           "--format", "markdown"),
        "flush": log_lines("flush.log", r"^add: median") + "\n" + flush_table(),
        "house": moebench("compare", "results/h200/house-before.json.gz", "results/h200/all-arms-untimed-reset.json.gz",
                          "--format", "markdown"),
        "determinism": determinism_rows(),
        "det-cost": moebench("report", "results/h200/det-cost.json.gz", "--format", "summary"),
        "ncu-offset": file_text("ncu-offset.md"),
        "noise": moebench("report", "results/h200/noise-cuda-fused.json", "--format", "summary"),
        "aa-proof": (RESULTS / "aa-proof" / "summary.md").read_text(),
        "fused-every-m": fused_every_m(),
        "fused-every-m-h100": fused_every_m(ROOT / "results" / "h100"),
        "a1-placement": placement_table(),
        "placements": placements_rows(),
        "sweep-fused-A": report_summary("sweep-fused-A"),
        "sweep-fused-Q": report_summary("sweep-fused-Q"),
        "graph": moebench("compare", "results/h200/graph-vs-eager-eager.json.gz",
                          "results/h200/graph-vs-eager-graph.json.gz", "--format", "markdown"),
        "resume": log_lines("gpu-failures-c240692.log", r"^killed", r"INCOMPLETE", r"^resume rc",
                            r"audit passed"),
        "failures": log_lines("gpu-failures-c240692.log", r"^moebench: error", r"^rc="),
        "sweep-A": report_summary("sweep-A"),
        "sweep-Q": report_summary("sweep-Q"),
    }


def report_summary(name: str) -> str:
    """The summary view of the H200's REPORTS[name], against REPORT_REF's arm where it names one."""
    return moebench("report", f"results/h200/{REPORTS['h200'][name]}", "--format", "summary",
                    *REPORT_REF.get(name, ()))


def write_docs() -> None:
    """docs/<gpu>/<name>.md: the full Markdown report of each run, its plots in docs/<gpu>/img/."""
    for gpu, reports in REPORTS.items():
        docs = ROOT / "docs" / gpu
        (docs / "img").mkdir(parents=True, exist_ok=True)
        for name, file in reports.items():
            moebench("report", f"results/{gpu}/{file}", "--format", "markdown", *REPORT_REF.get(name, ()),
                     "--output", f"docs/{gpu}/{name}.md", "--plot", f"docs/{gpu}/img", "--prefix", f"{name}-")
        for svg in (docs / "img").glob("*.svg"):  # the pages link the PNGs
            svg.unlink()


def marker(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- moebench:{re.escape(name)} -->\n).*?(<!-- /moebench:{re.escape(name)} -->)", re.S)


def fill_pages(parts: dict[str, str]) -> None:
    """Each section into the one page of PAGES that holds its markers."""
    texts = {page: (ROOT / page).read_text() for page in PAGES}
    for name, body in parts.items():
        holders = [page for page, text in texts.items() if marker(name).search(text)]
        if len(holders) != 1:
            raise SystemExit(f"section {name!r}: markers in {len(holders)} pages of {', '.join(PAGES)}, not one")
        page = holders[0]
        texts[page] = marker(name).sub(lambda m: m.group(1) + body.strip() + "\n" + m.group(2), texts[page])
    for page, text in texts.items():
        (ROOT / page).write_text(text)


if __name__ == "__main__":
    write_docs()
    fill_pages(sections())
    print("docs/h200/, docs/h100/ and the generated sections of README.md and docs/*.md regenerated")
