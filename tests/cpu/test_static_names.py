"""Every name a module reads is defined: pyflakes over the package, the scripts and the tests.
Code that only a GPU runs (the kernels' host checks, the device scripts) is never executed by
the CPU suite, so a misspelt or removed name there would otherwise first fail on the device."""

from __future__ import annotations

from pathlib import Path

import pytest

pyflakes_api = pytest.importorskip("pyflakes.api")
from pyflakes import messages  # noqa: E402
from pyflakes.reporter import Reporter  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# Unused imports are often deliberate re-exports; these are the classes that are bugs.
BUGS = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport,
        messages.DuplicateArgument, messages.ReturnOutsideFunction)


class Collect(Reporter):
    def __init__(self):
        self.found: list[str] = []

    def flake(self, message):
        if isinstance(message, BUGS):
            self.found.append(str(message))

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")


@pytest.mark.parametrize("folder", ["moebench", "scripts", "tests"])
def test_no_undefined_names(folder):
    reporter = Collect()
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files
    for path in files:
        pyflakes_api.checkPath(str(path), reporter)
    assert reporter.found == []


def test_the_check_finds_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return dict(capacity=cap)\n")
    reporter = Collect()
    pyflakes_api.checkPath(str(bad), reporter)
    assert len(reporter.found) == 1 and "undefined name 'cap'" in reporter.found[0]
