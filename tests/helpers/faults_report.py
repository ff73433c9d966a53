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
    kind: str  # e.g. "add_tokens raises", "NaN logits"; several joined by "+"
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


def _kinds(records: list[FaultRecord]) -> set[str]:
    return {kind for r in records if r.injected for kind in r.kind.split("+")}


def summarize(path: str) -> str:
    """A Markdown table: per boundary and in all, the kinds of fault, faults, bystanders, affected, leaks."""
    try:
        with open(path) as f:
            records = [FaultRecord(**json.loads(line)) for line in f if line.strip()]
    except FileNotFoundError:
        return f"no fault records in {path}"
    rows: dict[str, list[FaultRecord]] = defaultdict(list)
    for r in records:
        rows[r.boundary].append(r)
    lines = [
        "| boundary | kinds | faults injected | bystanders | bystanders affected | leaks |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for boundary, group in [*sorted(rows.items()), ("**total**", records)]:
        kinds = len(_kinds(group)) if group is not records else sum(len(_kinds(g)) for g in rows.values())
        totals = [sum(getattr(r, f) for r in group) for f in ("injected", "bystanders", "affected", "leaks")]
        lines.append(f"| {boundary} | {kinds} | " + " | ".join(map(str, totals)) + " |")
    return "\n".join(lines)
