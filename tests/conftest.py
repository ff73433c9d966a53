"""Shared fixtures: tiny random-weight models for most tests, the real SmolLM2 where it matters."""

from __future__ import annotations

import pytest
import torch
from helpers.require_all import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 - SRT_REQUIRE_ALL=1

from srt_agent.models import load_model, load_tokenizer, tiny_random_model


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct in float32 on CPU (converted once, then cached)."""
    return load_model("smollm2", dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest single-threaded, above all on a shared machine; a module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_llama():
    """A 2-layer random Llama in float64 (vocabulary 256)."""
    return tiny_random_model("llama", seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2():
    """A 2-layer random Qwen2 in float64 (vocabulary 256)."""
    return tiny_random_model("qwen2", seed=1)


def pytest_addoption(parser):
    parser.addoption(
        "--fault-report",
        default=None,
        metavar="PATH",
        help="append one JSON line per fault-injection test to PATH and print the totals (tests/faults)",
    )


def pytest_configure(config):
    path = config.getoption("--fault-report")
    if path is not None and getattr(config, "workerinput", None) is None:  # a new report per run
        open(path, "w").close()


def pytest_terminal_summary(terminalreporter, config):
    """The fault-injection figure (README): faults injected, kinds, requests hit beyond the faulty ones, leaks."""
    path = config.getoption("--fault-report")
    if path is None or getattr(config, "workerinput", None) is not None:
        return
    from helpers.faults_report import summarize

    terminalreporter.write_sep("=", "fault injection")
    terminalreporter.write_line(summarize(path))
