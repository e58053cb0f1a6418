"""A RunResult as Markdown for a pull-request description.

Summary table, per-round table, one sentence of method, provenance and the command that
reproduces the run. Every number is read from the result; nothing is computed here.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from moebench.analysis.ratio_verdicts import ratio_verdicts
from moebench.analysis.roofline import arm_floor, shape_floors
from moebench.analysis.throttle import run_line
from moebench.analysis.verdicts import is_win
from moebench.record.index import ResultIndex, mbytes, mib, placement_cells, ratio, tb_per_s, us
from moebench.record.metrics import timed_metric
from moebench.record.schema import RunResult, Settings
from moebench.views.determinism_view import det_text, determinism_markdown, verdicts_by_unit
from moebench.views.roofline_view import (FLOOR_HEADER, floor_cells, floor_note, read_floor_text, share_text,
                                          sweep_floor_rows, understated_note)
from moebench.views.tables import best_cells, build_parity_by_arm, build_parity_text, incomplete_text


@dataclass(frozen=True)
class Image:
    """A plot to embed: alt text and the link, relative to where the Markdown will live."""

    alt: str
    link: str


# How each flush policy is said in the method sentence (each timer declares its own words).
FLUSH_WORDS = {
    "read": lambda s: f"L2 flushed cold and clean by reading {mib(s.flush_bytes)}",
    "write": lambda s: (f"L2 flushed by writing {mib(s.flush_bytes)} (dirty lines: their "
                        "write-back can land in the timed kernels)"),
    "none": lambda s: "L2 not flushed (warm)",
}


def method_sentence(s: Settings) -> str:
    flush = FLUSH_WORDS.get(s.flush, lambda s: f"flush policy {s.flush!r}")(s)
    timer = timed_metric(s.timer).method
    order = ", ".join(f"`{a}`" for a in s.arms)
    call = "one call" if s.sampler == "eager" else "one replay of a CUDA graph of the flush and the call"
    return (f"Each sample is {call} with {flush} before it, {timer}; {s.rounds} rounds × "
            f"{s.samples} samples per arm ({s.warmup} warm-up{'' if s.warmup == 1 else 's'} each), odd rounds in the order "
            f"{order} and even rounds reversed; a row is a round's median, an arm's time the "
            f"median of its rows, a ratio the median over rounds of `{s.ref}` row / arm row "
            f"(> 1: the arm is faster)." + (
                f" Every arm was prepared {s.placements} times, each copy on buffers of its own, and round r "
                f"timed copy (r - 1) mod {s.placements}, so where its buffers landed is spread over the rounds."
                if s.placements > 1 else ""))


def render_markdown(result: RunResult, images: Sequence[Image] = ()) -> str:
    ix = ResultIndex(result)
    if not result.samples and result.determinism:  # verdicts alone (`verify --determinism --out`)
        heading = f"### moebench determinism: {', '.join(result.settings.shapes)}"
        return "\n\n".join(p for p in (determinism_markdown(result.determinism, heading), _provenance(ix),
                                        _reproduce(ix)) if p) + "\n"
    from moebench.views.parity_view import parity_markdown, parity_only
    if parity_only(result):  # parity rows alone (`verify --out`)
        heading = f"### moebench parity: {', '.join(result.settings.shapes)}"
        return "\n\n".join(p for p in (parity_markdown(result.parity, heading), _provenance(ix),
                                        _reproduce(ix)) if p) + "\n"
    parts = [_title(ix), _warnings(ix), _summary_table(ix), _sweep_floors(ix), method_sentence(result.settings),
             referee_markdown(result), placement_markdown(result), determinism_markdown(result.determinism),
             _per_round_table(ix), best_markdown(result),
             _images(images), _provenance(ix), _reproduce(ix)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _title(ix: ResultIndex) -> str:
    gpu = ix.result.provenance.gpu
    where = f" on {gpu.name}" if gpu else ""
    return f"### moebench: {', '.join(ix.shapes)}{where}"


def _warnings(ix: ResultIndex) -> str:
    lines = []
    partial = incomplete_text(ix.result)
    if partial:
        lines.append(f"> **Incomplete:** {partial}.")
    audit = ix.result.audit
    if not audit.samples_total:
        lines.append("> **Unaudited:** the file holds no samples.")
    elif not audit.passed:
        lines.append(f"> **Audit failed:** {audit.samples_passed}/{audit.samples_total} samples passed, "
                     f"{audit.dropped_records} dropped records, {len(audit.findings)} findings.")
    for p in ix.result.parity:
        if not p.passed:
            lines.append(f"> **Parity failed:** `{p.arm}` at {p.shape}: rel L2 {p.rel_l2:.3g} "
                         f"(threshold {p.threshold:g}), {p.nonfinite} non-finite.")
    if not ix.metric.reference:
        lines.append(f"> Timer: **{ix.settings.timer}**, not CUPTI kernel records.")
    flagged = understated_note(ix)
    if flagged:
        lines.append(f"> **{flagged[0].upper()}{flagged[1:]}.**")
    throttled = run_line(ix.result)
    if throttled:
        lines.append(f"> **Throttled:** {throttled}.")
    return "\n".join(lines)


def _table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    rule = {"l": "---", "r": "--:", "c": ":-:"}
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def bold_if(text: str, win: bool) -> str:
    """Bold marks a win (verdicts.is_win) and nothing else: a regression in bold reads as good news."""
    return f"**{text}**" if win else text


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _summary_table(ix: ResultIndex) -> str:
    header = ["shape", "arm", "median µs", "rounds µs", "span µs", f"vs `{ix.ref}`", "range over rounds",
              "rounds won", "HBM-floor bandwidth", "of read BW"]
    builds = build_parity_by_arm(ix.result)
    if builds:
        header.insert(8, f"output vs `{ix.result.build_parity[0].base}`")
    header += FLOOR_HEADER
    det = verdicts_by_unit(ix.result.determinism)
    if det:
        header.append("det")
    floors = shape_floors(ix.result)
    verdicts = ratio_verdicts(ix.result)
    rows = []
    for shape in ix.shapes:
        for arm in ix.arms_at(shape):
            s = ix.summary(shape, arm)
            r = ix.ratio(shape, arm)
            name = f"`{arm}` (ref)" if arm == ix.ref else f"`{arm}`"
            cells = [shape, name, us(s.median_ns), f"{us(s.min_ns)}–{us(s.max_ns)}", us(s.span_median_ns)]
            if r is None:
                cells += ["—", "—", "—"]
            else:
                v = verdicts.get((shape, arm))  # none where the file's samples make none (read as stored)
                cells += [bold_if(ratio(r.median), v is not None and is_win(v.verdict)), f"{ratio(r.low)}–{ratio(r.high)}",
                          f"{r.rounds_won}/{r.rounds}"]
            if builds:
                cells.append(build_parity_text(builds.get((shape, arm)), arm, ix.result))
            cells += [tb_per_s(s.hbm_bandwidth_bytes_per_s), share_text(arm_floor(s, floors.get(shape)), digits=1)]
            cells += floor_cells(floors, shape, s.median_ns)
            if det:
                cells.append(det_text(det.get((shape, arm))))
            rows.append(cells)
    note = floor_note(ix)
    align = "llrrrrrrrr" + ("r" if builds else "") + "rrlr" + ("l" if det else "")
    return _table(header, align, rows) + (f"\n\n{note}." if note else "")


def best_markdown(result: RunResult) -> str:
    """Each arm against its shape's best of the stock and peer arms (moebench.analysis.stats.best_ratios),
    beside its ratio against the ref; empty unless the run holds two of them."""
    from moebench.analysis.stats import BEST_OF, best_ratios
    best = best_ratios(result)
    if not best:
        return ""
    ref = result.settings.ref
    rows = []
    for b in best:
        vs_ref, vs_best, won = best_cells(result, b)
        rows.append([b.shape, f"`{b.arm}`", vs_ref, vs_best, f"`{b.best}`", won])
    head = (f"Against the best of {', '.join(f'`{a}`' for a in BEST_OF)} present at each shape (lowest "
            f"median; best-row / arm-row per round, median over rounds, > 1: the arm is faster):")
    return head + "\n\n" + _table(["shape", "arm", f"vs `{ref}`", "vs best", "best", "rounds won vs best"],
                                   "llrrlr", rows)


def _sweep_floors(ix: ResultIndex) -> str:
    """Per sweep family, the floors against M and each arm over the binding one."""
    return "\n\n".join(f"Family {family}: floors against M (µs) and each arm's median over the binding floor:\n\n"
                       + _table(header, "rl" + "rrl" + "r" * (len(header) - 5), rows)
                       for family, header, rows in sweep_floor_rows(ix))


def referee_markdown(result: RunResult) -> str:
    """The stock arm against its referee, where the run has both (moebench.analysis.stats.referee_checks)."""
    from moebench.analysis.stats import referee_checks, referee_labels
    checks = referee_checks(result)
    if not checks:
        return ""
    labels = referee_labels(checks)
    rows = [[c.shape, f"`{c.arm}`", f"`{c.referee}`", f"{c.call_ratio:.3f}",
             *(f"{c.kernel_ratios[lab]:.3f}" if lab in c.kernel_ratios else "—" for lab in labels),
             "within" if c.passed else "**outside**"] for c in checks]
    table = _table(["shape", "stock arm", "referee", "call", *labels, f"±{checks[0].tolerance:.0%}"],
                   "lllr" + "r" * len(labels) + "l", rows)
    return ("Stock arm against its referee (time ratio stock / referee; the call paired by round, each kernel "
            "its median of round medians):\n\n" + table)


def placement_markdown(result: RunResult) -> str:
    """Each arm by placement, for a run of several (moebench.analysis.stats.placement_summaries)."""
    from moebench.analysis.stats import placement_summaries
    rows = [[p.shape, f"`{p.arm}`", *placement_cells(p)] for p in placement_summaries(result)]
    if not rows:
        return ""
    return ("By placement (the median of the rounds each prepared copy ran, µs; the ratio against "
            f"`{result.settings.ref}` in those rounds):\n\n"
            + _table(["shape", "arm", "median per placement", "spread", "ratio per placement"],
                     ["l", "l", "r", "r", "r"], rows))


def _per_round_table(ix: ResultIndex) -> str:
    header = ["shape", "row"] + [f"round {r}" for r in ix.rounds]
    rows = []
    for shape in ix.shapes:
        for arm in ix.arms_at(shape):
            s = ix.summary(shape, arm)
            rows.append([shape, f"`{arm}` µs"] + [us(v) for v in s.row_medians_ns])
        for arm in ix.compared_arms(shape):
            r = ix.ratio(shape, arm)
            rows.append([shape, f"`{r.ref}` / `{arm}`"] + [ratio(v) for v in r.per_round])
    width = 2 + len(ix.rounds)
    rows = [row + [""] * (width - len(row)) for row in rows]
    return "Per round (a row is the median of the round's samples):\n\n" + _table(header, "ll" + "r" * len(ix.rounds), rows)


def _images(images: Sequence[Image]) -> str:
    return "\n".join(f"![{im.alt}]({im.link})" for im in images)


def provenance_facts(ix: ResultIndex) -> list[tuple[str, str]]:
    """The run's facts as (name, value) rows: GPU, clocks, commit, versions, timer, audit, options."""
    res, prov = ix.result, ix.result.provenance
    gpu = prov.gpu
    facts = []
    if gpu:
        facts.append(("GPU", f"{gpu.name} (sm {gpu.compute_capability}, {gpu.sm_count} SMs, "
                             f"L2 {mib(gpu.l2_bytes)}, {gpu.memory_bytes / 2**30:,.0f} GiB), "
                             f"driver {gpu.driver}, CUDA {gpu.cuda_runtime}"))
        facts.append(("max clocks", f"SM {_mhz(gpu.max_sm_clock_mhz)}, memory {_mhz(gpu.max_mem_clock_mhz)}"))
        facts.append(("measured read bandwidth", read_floor_text(gpu)))
    commit = prov.git_commit or "unknown"
    if prov.git_dirty:
        commit += " (uncommitted changes)"
    facts += [
        ("commit", f"`{commit}`"),
        ("moebench source sha256", f"`{prov.package_sha256}`" if prov.package_sha256 else "—"),
        ("moebench", f"{prov.tool_version}, Python {prov.python}"),
        ("libraries", ", ".join(f"{k} {v}" for k, v in sorted(prov.libraries.items())) or "—"),
        ("host, time", f"{prov.hostname}, {prov.started_at} – {prov.finished_at}"),
        ("timer, flush, sampler", f"{res.settings.timer}, {res.settings.flush} ({mib(res.settings.flush_bytes)}), "
                                  f"{res.settings.sampler}"),
        ("audit", "unaudited (no samples)" if not res.audit.samples_total else
                  f"{res.audit.samples_passed}/{res.audit.samples_total} samples passed, "
                  f"{res.audit.dropped_records} dropped records, {len(res.audit.findings)} findings"),
    ]
    if res.settings.options:
        facts.append(("options", ", ".join(f"{k}={_short(v)}" for k, v in sorted(res.settings.options.items()))))
    return facts


def _provenance(ix: ResultIndex) -> str:
    res = ix.result
    blocks = [_table(["", ""], "ll", provenance_facts(ix))]

    blocks.append(_table(
        ["shape", "M K E top_k N", "seed", "balancedness", "HBM floor", "GFLOP", "fingerprint"], "lllrrrl",
        [[f.name, f"{f.M} {f.K} {f.E} {f.top_k} {f.N}", str(f.seed), f"{f.balancedness:g}",
          mbytes(f.floors.hbm_bytes), f"{f.floors.flops / 1e9:,.3f}", f"`{f.fingerprint}`"]
         for f in (ix.fixture(s) for s in ix.shapes) if f is not None]))
    blocks.append(_table(
        ["shape", "arm", "build identity"], "lll",
        [[a.shape, f"`{a.name}`", "<br>".join(f"{k}: `{_short(v)}`" for k, v in sorted(a.identity.items())) or "—"]
         for a in res.arms]))
    blocks.append(_table(
        ["shape", "arm", "oracle roundings", "rel L2 vs that oracle", "rel L2 vs exact", "max abs",
         "non-finite", "passed"], "lllrrrrl",
        [[p.shape, f"`{p.arm}`", p.oracle, f"{p.rel_l2:.2e}",
          f"{p.rel_l2:.2e}" if p.rel_l2_exact is None else f"{p.rel_l2_exact:.2e}", f"{p.max_abs:.3g}",
          str(p.nonfinite), "yes" if p.passed else "**no**"] for p in res.parity]))
    if res.clocks:
        blocks.append(_table(
            ["round", "SM MHz", "memory MHz", "°C", "W"], "rrrrr",
            [[str(c.round), _num(c.sm_mhz), _num(c.mem_mhz), _num(c.temperature_c),
              "—" if c.power_w is None else f"{c.power_w:.0f}"] for c in res.clocks]))
    body = "\n\n".join(blocks)
    return f"<details><summary>Provenance</summary>\n\n{body}\n\n</details>"


def _reproduce(ix: ResultIndex) -> str:
    return "Reproduce:\n\n```sh\n" + shlex.join(ix.result.provenance.command) + "\n```"


def _mhz(v: int | None) -> str:
    return "—" if v is None else f"{v} MHz"


def _num(v) -> str:
    return "—" if v is None else str(v)


def _short(v) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(",", ":"))


def render_summary(result: RunResult) -> str:
    """The summary table and the method sentence alone: what a README or a PR's first
    screen shows (the full report links from there)."""
    ix = ResultIndex(result)
    parts = [_title(ix), _warnings(ix), _summary_table(ix), method_sentence(result.settings), referee_markdown(result)]
    return "\n\n".join(p for p in parts if p) + "\n"
