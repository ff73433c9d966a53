"""How long a code-tool call costs: sandbox latency and throughput against a bare Python start."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..tools.base import CodeSandbox
from ..tools.local import LocalSandbox

PROGRAM = "import math\nprint(sum(math.isqrt(i) for i in range(1000)))\n"


def _latencies(call: Callable[[], object], runs: int) -> dict:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "runs": runs,
        "mean_ms": 1000 * statistics.fmean(times),
        "p50_ms": 1000 * times[len(times) // 2],
        "p95_ms": 1000 * times[min(len(times) - 1, int(0.95 * len(times)))],
    }


def _throughput(sandbox: CodeSandbox, runs: int, workers: int) -> dict:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        statuses = list(pool.map(lambda _: sandbox.run(PROGRAM).status, range(runs)))
    elapsed = time.perf_counter() - start
    return {"workers": workers, "runs": runs, "runs_per_s": runs / elapsed, "all_ok": statuses.count("ok") == runs}


def bench_sandboxes(sandboxes: dict[str, CodeSandbox], runs: int = 20, workers: tuple[int, ...] = (1, 4)) -> dict:
    """Latency of one small program per sandbox (plus a bare `python -c` start), and throughput."""
    python = str(next((s.interpreter for s in sandboxes.values() if isinstance(s, LocalSandbox)), "python3"))
    bare = _latencies(lambda: subprocess.run([python, "-c", PROGRAM], capture_output=True), runs)
    result: dict = {"program": PROGRAM, "bare_python": bare}
    for name, sandbox in sandboxes.items():
        result[name] = {
            "latency": _latencies(lambda sandbox=sandbox: sandbox.run(PROGRAM), runs),
            "throughput": [_throughput(sandbox, runs, n) for n in workers],
        }
    return result
