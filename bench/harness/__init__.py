"""The benchmark harness behind `bench/run PRESET`: one entry point (cli.py), one results
schema (results.py), presets native, guest, evaluation, doorbell and ftrace (one module each).
The harness writes results files only; the report writer (bench/reporting, `bench/report`)
turns them into docs/performance.md and is never called from here."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class BenchError(Exception):
    """Something could not be measured: the run fails (exit 1) with this message."""


class Prerequisite(Exception):
    """A missing prerequisite (root, a tool, a build): exit 2 with this message."""
