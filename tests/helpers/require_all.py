"""SRT_REQUIRE_ALL=1 (set by CI): a skipped test is a failure that names what is missing.

A failed install step must not turn an integration's tests into skips and the run green. Only a skip
whose reason says the machine itself lacks something may stay: its reason starts with "hardware:" (no
CUDA, no oneDNN, no syscall table for this CPU) or "machine:" (no Docker daemon, no writable cgroups).
Skips are caught both at collection (a module-level `pytest.importorskip`) and when a test runs
(`skipif` marks, `pytest.skip` in a test or fixture); xfails are left alone.

A venv that leaves components out on purpose names them in SRT_ABSENT_BY_DESIGN (words separated by
spaces or commas, e.g. "verl trl" in the vLLM matrix venv, whose transformers verl refuses): a skip whose
reason names one of them as a word may stay too. Nothing else is excused there.
"""

from __future__ import annotations

import os
import re

import pytest

VARIABLE = "SRT_REQUIRE_ALL"
ABSENT_VARIABLE = "SRT_ABSENT_BY_DESIGN"
MACHINE_PREFIXES = ("hardware:", "machine:")


def allowed(reason: str) -> bool:
    """Whether a skip with this reason may stay under SRT_REQUIRE_ALL=1."""
    reason = reason.removeprefix("Skipped: ")
    return os.environ.get(VARIABLE) != "1" or reason.startswith(MACHINE_PREFIXES) or absent_by_design(reason)


def absent_by_design(reason: str) -> bool:
    """Whether the reason names a component this venv leaves out on purpose (SRT_ABSENT_BY_DESIGN)."""
    names = [n for n in re.split(r"[\s,]+", os.environ.get(ABSENT_VARIABLE, "")) if n]
    return any(re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w])", reason, re.IGNORECASE) for n in names)


def failure(reason: str) -> str:
    return f"{VARIABLE}=1: skipped for something this machine could have installed: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception):
        reason = str(call.excinfo.value)
        if not allowed(reason):
            report.outcome, report.longrepr = "failed", failure(reason)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not allowed(reason):
            report.outcome, report.longrepr = "failed", failure(reason)
    return report
