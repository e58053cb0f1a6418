"""The front door: a README a newcomer reads in minutes, whose test command CI runs, whose links
resolve, and whose headline table is the one `report --format pr` prints from the committed file.
The design record stays a record of what is (<= 400 lines), its history in the lab notebook."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("h*/results.md"))]


def _code_lines(text: str) -> list[str]:
    return [ln.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S) for ln in block.splitlines()]


def test_the_readme_is_short_and_has_the_two_setup_commands():
    assert len(README.splitlines()) <= 250
    commands = _code_lines(README)
    assert "pip install -e . && moebench run --shape A8" in commands
    assert "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest -q" in commands


def test_ci_runs_the_readmes_test_command():
    test_command = next(c for c in _code_lines(README) if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    for step in test_command.split(" && "):
        step = step.replace("pip install", "python -m pip install -q")
        assert step in ci, step


def test_every_relative_link_of_the_front_door_and_docs_resolves():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"


def test_the_headline_table_is_the_pr_view_of_the_committed_run():
    from moebench.views.pr_view import render_pr
    from moebench.analysis.load import load
    body = re.search(r"<!-- moebench:headline -->\n(.*?)<!-- /moebench:headline -->", README, re.S)[1]
    pr = render_pr(load(ROOT / "results" / "h200" / "all-arms.json")).split("<details>")[0]
    table = [ln for ln in pr.splitlines() if ln.startswith("|")]
    assert body.strip().splitlines() == table


def test_the_design_record_is_current_and_its_history_kept():
    kernels = (ROOT / "docs" / "kernels.md").read_text()
    notebook = (ROOT / "docs" / "lab-notebook.md").read_text()
    assert len(kernels.splitlines()) <= 400
    for family in ("triton", "cuda-gemm, cuda-swapab", "cuda-fused", "cuda-fused-det"):
        assert f"## {family}" in kernels
    assert "## Experiments and their measured effect" in kernels and "lab-notebook.md" in kernels
    assert len(notebook.splitlines()) > len(kernels.splitlines())
    assert len(set(re.findall(r"\b[0-9a-f]{7}\b", notebook))) >= 150  # the commits the history cites
