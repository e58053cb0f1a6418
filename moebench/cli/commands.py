"""Imports every command module so that each registers itself on the `cli` group."""

from moebench.cli import fixtures_cmd  # noqa: F401
from moebench.cli import report_cmd  # noqa: F401
from moebench.cli import verify_cmd  # noqa: F401
from moebench.cli import arms_cmd  # noqa: F401
from moebench.cli import build_cmd  # noqa: F401
from moebench.cli import run_cmd  # noqa: F401
from moebench.cli import probe_cmd  # noqa: F401
from moebench.cli import doctor_cmd  # noqa: F401
from moebench.cli import compare_cmd  # noqa: F401
from moebench.cli import sweep_cmd  # noqa: F401
from moebench.cli import profile_cmd  # noqa: F401
from moebench.cli import tune_cmd  # noqa: F401
