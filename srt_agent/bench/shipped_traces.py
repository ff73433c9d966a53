"""Rollout traces shipped with the package, read by name by ``bench headroom``, ``bench replay`` and ``bench
project`` (``srt-agent bench headroom retool_long``): each is a real run's every step, recorded once, so a
drafting claim gets its figure by exact replay without rerunning the model. docs/benchmarks/traces.md says
what each holds and the command that recorded it."""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).with_name("traces")
SHIPPED_TRACES = {"retool_long": FOLDER / "retool_long.json.xz"}


def recorded(source: str | Path) -> Path:
    """The path of a recorded run or trace: a shipped trace's, by its name, else `source` itself."""
    if isinstance(source, str) or not Path(source).exists():
        shipped = SHIPPED_TRACES.get(str(source))
        if shipped is not None:
            if not shipped.is_file():
                raise ValueError(f"the shipped trace {source!r} is missing from this install ({shipped})")
            return shipped
    return Path(source)
