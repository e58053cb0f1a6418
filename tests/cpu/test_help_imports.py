"""`moebench --help` and every `moebench COMMAND --help` answer without importing torch, Triton,
CUDA or numpy: the command modules import their stages inside the commands. Checked by what a
fresh interpreter holds after answering, not by timing it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "triton", "cuda", "numpy", "pandas", "matplotlib")

PROBE = """
import contextlib, io, json, sys
from moebench.cli import cli, main
names = sorted(cli.commands)
out = {}
for argv in [["--help"], *([name, "--help"] for name in names)]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code
    out[" ".join(argv)] = [code, len(buf.getvalue())]
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
print(json.dumps({"runs": out, "heavy": heavy, "names": names}))
"""


def test_every_help_answers_without_torch_triton_or_cuda():
    done = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"run", "sweep", "verify", "report", "compare", "profile", "probe", "doctor"} <= set(found["names"])
    for argv, (code, size) in found["runs"].items():
        assert code == 0 and size > 100, argv  # a real help page, exit 0
    assert found["heavy"] == [], f"--help imported {found['heavy']}"


def test_the_choices_help_shows_are_the_ones_the_stages_use():
    from moebench import choices
    from moebench.views.compare_view import COMPARE_FORMATS
    assert tuple(COMPARE_FORMATS) == choices.COMPARE_FORMAT_NAMES
