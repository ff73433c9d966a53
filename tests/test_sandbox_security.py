"""The local sandbox under a 100 MB flood of output: the host's memory does not grow with it.

The hostile battery (fork bombs, memory, disk, network, host files, signals, ...) runs through every backend
in tests/test_sandbox_hostile.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.sandbox_hostile import MAX_OUTPUT

from srt_agent.tools import LocalSandbox
from srt_agent.tools.local import bwrap_path

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def test_100mb_of_output_does_not_grow_host_memory():
    """Peak RSS (VmHWM) is reset first, so it starts at the current RSS and the run's own peak shows."""
    sandbox = LocalSandbox(timeout_s=10, max_output_bytes=MAX_OUTPUT)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current RSS
    before = _status_kb("VmRSS")
    assert _status_kb("VmHWM") < before + 8 * 1024, "the peak did not reset: the check would be blind"
    result = sandbox.run("import sys\nfor _ in range(100):\n    sys.stdout.write('y' * (1 << 20))\n")
    grown_kb = _status_kb("VmHWM") - before
    assert result.status == "output_limit" and len(result.stdout) == MAX_OUTPUT
    assert grown_kb < 32 * 1024
