"""The record: what a run is (RunResult and its parts), how it is written and read, where it came
from, and the facts every stage names (metrics, datasheet peaks). The bottom stage: it imports
nothing of moebench but `moebench.errors`, so every other stage may use it."""

VERSION = "0.1.0"  # moebench's version, written into every result (pyproject.toml says the same)
