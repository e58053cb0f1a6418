"""Imports every command module so that each registers itself on the `cli` group."""

from moebench.cli import fixtures_cmd  # noqa: F401
from moebench.cli import report_cmd  # noqa: F401
from moebench.cli import build_cmd  # noqa: F401
