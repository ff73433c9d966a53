"""Fault injection fixtures: the ledger (see tests/helpers/faults_report.py) and single-threaded torch."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from helpers.faults_report import FaultLedger


@pytest.fixture(scope="session")
def ledger(pytestconfig) -> FaultLedger:
    return FaultLedger(pytestconfig.getoption("--fault-report"))


@pytest.fixture(autouse=True, scope="module")
def single_threaded(one_thread):
    """Every fault test runs its tiny models single-threaded (tests/conftest.py's one_thread)."""


@pytest.fixture(autouse=True)
def private_temp_dir(monkeypatch):
    """Temp files are counted (helpers.fault_injection.host_leaks) in a folder of this test's own: other processes on the
    machine (pip, compilers, other test workers) write into the shared one. World-traversable, as the shared
    one is, so sandboxed tool runs under another uid can reach what is made there."""
    path = tempfile.mkdtemp(prefix="srt-faults-")
    os.chmod(path, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", path)
    monkeypatch.setenv("TMPDIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)
