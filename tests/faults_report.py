"""The fault-injection ledger: each test in tests/faults records what it injected and what it saw.

With ``pytest tests/faults --fault-report PATH`` every record is appended to PATH as a JSON line (xdist
workers share the file) and the run ends with the totals that README quotes.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass


@dataclass
class FaultRecord:
    """One test's injections: where, what, how many, and what they did to everything else."""

    boundary: str  # drafter, model, sampler, async front, tool call, sandbox, server, cache file, cache save
    kind: str  # e.g. "add_tokens raises", "NaN logits", "SIGKILL of the sandbox"
    injected: int  # faults injected
    bystanders: int  # requests, runs or calls in flight beside the faulty ones
    affected: int  # bystanders whose result differs from their fault-free result (goal: 0)
    leaks: int  # processes, threads, fds, temp files, KV slots, drafter requests, cache bytes left over (goal: 0)


class FaultLedger:
    def __init__(self, path: str | None):
        self.path = path

    def record(self, record: FaultRecord) -> None:
        if self.path is None:
            return
        line = json.dumps(asdict(record)) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write on an O_APPEND file: lines of parallel workers never mix
        finally:
            os.close(fd)


def summarize(path: str) -> str:
    """A table per boundary and the totals."""
    try:
        with open(path) as f:
            records = [FaultRecord(**json.loads(line)) for line in f if line.strip()]
    except FileNotFoundError:
        return f"no fault records in {path}"
    rows: dict[str, list[FaultRecord]] = defaultdict(list)
    for r in records:
        rows[r.boundary].append(r)
    lines = [f"{'boundary':<14} {'kinds':>5} {'injected':>8} {'bystanders':>10} {'affected':>8} {'leaks':>5}"]
    for boundary, group in rows.items():
        kinds = len({r.kind for r in group})
        totals = [sum(getattr(r, f) for r in group) for f in ("injected", "bystanders", "affected", "leaks")]
        lines.append(f"{boundary:<14} {kinds:>5} {totals[0]:>8} {totals[1]:>10} {totals[2]:>8} {totals[3]:>5}")
    kinds = len({(r.boundary, r.kind) for r in records})
    totals = [sum(getattr(r, f) for r in records) for f in ("injected", "bystanders", "affected", "leaks")]
    lines.append(f"{'total':<14} {kinds:>5} {totals[0]:>8} {totals[1]:>10} {totals[2]:>8} {totals[3]:>5}")
    return "\n".join(lines)
