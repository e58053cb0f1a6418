"""Determinism checks of a prepared arm: bitwise run to run, batch invariance, across
processes (the fresh process is `child`), and the RunResult of a verdicts-only check."""
