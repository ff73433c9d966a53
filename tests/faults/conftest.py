"""Fault injection fixtures: the ledger (see tests/faults_report.py) and single-threaded torch."""

from __future__ import annotations

import pytest
from faults_report import FaultLedger


@pytest.fixture(scope="session")
def ledger(pytestconfig) -> FaultLedger:
    return FaultLedger(pytestconfig.getoption("--fault-report"))


@pytest.fixture(autouse=True, scope="module")
def single_threaded(one_thread):
    """Every fault test runs its tiny models single-threaded (tests/conftest.py's one_thread)."""
