"""Fault injection fixtures: the ledger (see tests/faults_report.py) and single-threaded torch."""

from __future__ import annotations

import pytest
import torch
from faults_report import FaultLedger


@pytest.fixture(scope="session")
def ledger(pytestconfig) -> FaultLedger:
    return FaultLedger(pytestconfig.getoption("--fault-report"))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest single-threaded, above all on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
