"""A RunResult as a pull-request paste (`report --format pr`): one table and a collapsed block.

The table has a row per shape and arm: the median, the ratio against the reference with its
bootstrap interval, and the ratio's verdict against the run's noise floor (results/ratio_verdicts.py;
only a win is bold, results/verdicts.is_win). The
<details> block holds what a reviewer checks before trusting it: the method, the GPU and the
software, the audit, the fixtures' fingerprints, each arm's build, and the command that redoes
the run. A GitHub comment takes 65,536 characters: parts are dropped, last first, to stay
within PR_LIMIT_BYTES, and the paste says what it left out. Nothing is computed here.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from moebench.analysis.ratio_verdicts import ratio_verdicts
from moebench.analysis.verdicts import is_win
from moebench.record.index import ResultIndex, mbytes, ratio, us
from moebench.record.schema import RunResult
from moebench.views.determinism_view import determinism_markdown
from moebench.views.markdown import _table, _title, _warnings, bold_if, method_sentence, provenance_facts
from moebench.views.parity_view import parity_markdown, parity_only

PR_LIMIT_BYTES = 60_000  # under GitHub's 65,536 characters a comment, with room for a line of text
FULL_REPORT = "moebench report {file} --format markdown"


@dataclass(frozen=True)
class Part:
    """One piece of the details block; `keep` pieces are never dropped."""

    name: str
    text: str
    keep: bool = False


def render_pr(result: RunResult, limit_bytes: int = PR_LIMIT_BYTES) -> str:
    """The paste: within `limit_bytes` of UTF-8, naming every part it left out."""
    ix = ResultIndex(result)
    if not result.samples and result.determinism:  # verdicts alone (`verify --determinism --out`)
        heading = f"### moebench determinism: {', '.join(result.settings.shapes)}"
        head = determinism_markdown(result.determinism, heading)
    elif parity_only(result):  # parity rows alone (`verify --out`)
        head = parity_markdown(result.parity, f"### moebench parity: {', '.join(result.settings.shapes)}")
    else:
        head = "\n\n".join(p for p in (_title(ix), _warnings(ix)) if p)
    rows = result_rows(ix)
    total_rows = len(rows)
    parts = _details_parts(ix)
    left_out: list[str] = []
    while True:
        text = _assemble(head, rows, parts, left_out)
        if len(text.encode("utf-8")) <= limit_bytes:
            return text
        droppable = [p for p in parts if not p.keep]
        if droppable:
            parts = [p for p in parts if p is not droppable[-1]]
            left_out.append(droppable[-1].name)
            continue
        if len(rows) <= 1:
            return text  # nothing left to cut: the head and the kept details alone are this long
        # Still too long with the details cut to the bone: the table's last rows go.
        cut = max(1, len(rows) // 10)
        rows = rows[:-cut]
        left_out = [n for n in left_out if not n.startswith("table rows")]
        left_out.append(f"table rows after {rows[-1][0]} `{_arm_name(rows[-1][1])}` "
                        f"({total_rows - len(rows)} rows)")


def _arm_name(cell: str) -> str:
    return cell.strip("`").removesuffix("` (ref)")


def result_rows(ix: ResultIndex) -> list[list[str]]:
    verdicts = ratio_verdicts(ix.result)
    rows = []
    for shape in ix.shapes:
        for arm in ix.arms_at(shape):
            s, r = ix.summary(shape, arm), ix.ratio(shape, arm)
            if r is None:
                name = f"`{arm}` (ref)" if arm == ix.ref else f"`{arm}`"
                rows.append([shape, name, us(s.median_ns), "—", "ref" if arm == ix.ref else "—"])
                continue
            v = verdicts.get((shape, arm))  # none where the file's samples make none (read as stored)
            if v is None:
                rows.append([shape, f"`{arm}`", us(s.median_ns), f"{ratio(r.median)}", "unaudited"])
                continue
            rows.append([shape, f"`{arm}`", us(s.median_ns), f"{ratio(r.median)} [{v.ci[0]:.3f}, {v.ci[1]:.3f}]",
                         bold_if(v.verdict.value, is_win(v.verdict))])
    return rows


def _assemble(head: str, rows: list[list[str]], parts: Sequence[Part], left_out: Sequence[str]) -> str:
    ref = next((r[1] for r in rows if r[1].endswith("(ref)")), None)
    vs = f"vs {ref.removesuffix(' (ref)')} [95% CI]" if ref else "ratio [95% CI]"
    table = _table(["shape", "arm", "µs", vs, "verdict"], "llrrl", rows) if rows else ""
    body = [p.text for p in parts]
    if left_out:
        body.append("Left out to fit a comment: " + "; ".join(left_out) + ". The full report: `"
                    + FULL_REPORT.format(file="RESULT") + "`.")
    details = "<details><summary>Settings, provenance, command</summary>\n\n" + "\n\n".join(body) + "\n\n</details>"
    legend = "" if not rows else (
        "µs: the median of round medians. Ratio: reference time / arm time (> 1: the arm is faster), "
        "the median over paired rounds, with its bootstrap interval. Verdict: faster or slower where "
        "the interval lies beyond the run's A/A noise floor and the rank test agrees, same inside it, "
        "ambiguous otherwise (2% where the run measured no floor).\n")
    return "\n\n".join(p for p in (head, table, legend, details) if p) + "\n"


def _details_parts(ix: ResultIndex) -> list[Part]:
    res = ix.result
    facts = _table(["", ""], "ll", provenance_facts(ix))
    command = "```sh\n" + shlex.join(res.provenance.command) + "\n```"
    fixtures = _table(
        ["shape", "M K E top_k N", "seed", "b", "HBM floor", "fingerprint"], "lllrrl",
        [[f.name, f"{f.M} {f.K} {f.E} {f.top_k} {f.N}", str(f.seed), f"{f.balancedness:g}",
          mbytes(f.floors.hbm_bytes), f"`{f.fingerprint[:16]}`"]
         for f in (ix.fixture(s) for s in ix.shapes) if f is not None])
    builds = _table(["arm", "shapes", "build"], "lll", _build_rows(ix))
    noise = [f"{shape}: " + ", ".join(f"`{arm}` ±{f:.2%}" for arm, f in arms.items())
             for shape, arms in res.noise.items()]
    parts = [Part("method", method_sentence(res.settings), keep=True)] if res.samples else []
    parts += [Part("provenance", facts, keep=True),
             Part("command", "Reproduce:\n\n" + command, keep=True)]
    if noise:
        parts.append(Part("noise floors", "Noise floors (A/A): " + "; ".join(noise) + "."))
    if res.fixtures:
        parts.append(Part("fixtures", fixtures))
    if res.arms:
        parts.append(Part("arm builds", builds))
    return parts


# Identity keys that name a build in a line (the full identity is in the file and the markdown report).
BUILD_KEYS = ("engine", "config_source", "path", "layout", "source", "build_hash", "binary_sha256", "triton_version")


def _build_rows(ix: ResultIndex) -> list[list[str]]:
    """One row per arm and distinct build: its shapes and the identity keys that name the build."""
    rows: dict[tuple[str, str], list[str]] = {}
    for a in ix.result.arms:
        named = _named(a.identity)
        key = (a.name, named)
        rows.setdefault(key, []).append(a.shape)
    return [[f"`{arm}`", ", ".join(shapes), named or "—"] for (arm, named), shapes in rows.items()]


def _named(identity: dict) -> str:
    """The BUILD_KEYS of an identity and of its `build` record (hashes cut to 12 digits)."""
    found = {k: identity[k] for k in BUILD_KEYS if k in identity}
    build = identity.get("build")
    if isinstance(build, dict):
        found.update({f"build.{k}": build[k] for k in BUILD_KEYS if k in build})
    cells = []
    for k, v in found.items():
        if isinstance(v, (str, int, float)):
            text = str(v)
            cells.append(f"{k} `{text[:12] if k.endswith(('hash', 'sha256')) else text}`")
    return ", ".join(cells)
