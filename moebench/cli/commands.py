"""Imports every command module so that each registers itself on the `cli` group."""

from moebench.cli import fixtures_cmd  # noqa: F401
