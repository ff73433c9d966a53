"""Progress on the console, one helper for every long command: what runs now, done of total, elapsed time and
an estimate of the rest.

On a terminal a live rich bar shows it; where the console is a pipe or a log, a bar would leave blank lines or
control codes behind, so there each finished unit of work is one plain line instead
(``engine [3/18] srt b=8 epoch 2: 45.1 tok/s  (1:12 elapsed, ~3:40 left)``). A fine-grained phase (a bar per
trajectory or per trained token) draws on a terminal only (`lines=False`): its unit is too small for a line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress as Bar,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: moves a phase's bar: ``update(advance=n)``, or ``update(completed=, total=, <field>=…)``
PhaseUpdate = Callable[..., None]
#: opens a phase's bar: ``with phase(label, total) as update: …``
Phase = Callable[..., "contextmanager[PhaseUpdate]"]


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A command's work in units (runs, steps, stages): `now` says what runs, `done` finishes units."""

    def __init__(self, console: Console, label: str, total: float | None, lines: bool | None, bar: Bar | None):
        self.console, self.label, self.total, self.lines = console, label, total, lines
        self.completed = 0.0
        self.started = time.perf_counter()
        self._first: tuple[float, float] | None = None  # (elapsed, completed) when the first unit finished
        self._bar = bar
        self._task = bar.add_task("", total=total, now="") if bar is not None else None

    @classmethod
    def unseen(cls) -> Progress:
        """Progress shown nowhere (the default for library callers)."""
        return cls(Console(quiet=True), "", None, False, None)

    def now(self, what: str) -> None:
        """Say what runs now (shown beside a terminal's bar)."""
        if self._bar is not None:
            self._bar.update(self._task, now=what)

    def done(self, note: str = "", units: float = 1) -> None:
        """Finish `units` of work; `note` says which and what came of it (one line where lines are on)."""
        self.update(advance=units, note=note)

    def add_total(self, units: float) -> None:
        """Grow the total by `units` (work found on the way)."""
        self.update(total=(self.total or 0) + units)

    def update(self, note: str = "", **changes) -> None:
        """Move the bar as rich's ``Progress.update`` does (``advance=``, ``completed=``, ``total=``, fields);
        work finished makes a line where lines are on (`note`, else the fields: ``loss 1.234``)."""
        before = self.completed
        self.total = changes.get("total", self.total)
        self.completed = changes.get("completed", self.completed) + changes.get("advance", 0)
        if self._bar is not None:
            self._bar.update(self._task, **changes)
        if self.completed <= before:
            return
        if self._first is None:
            self._first = (time.perf_counter() - self.started, self.completed)
        if self.lines or (self.lines is None and self._bar is None):
            fields = {k: v for k, v in changes.items() if k not in ("advance", "completed", "total", "now")}
            note = note or ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
            self.console.print(self.line(note), highlight=False, markup=False, soft_wrap=True)

    def left(self, elapsed: float) -> float:
        """Seconds the rest should take at the pace since the first unit finished (what came before it, a
        model's loading, is paid once), or at the first unit's pace while one is done."""
        if self._first is None or self.completed - self._first[1] <= 0:
            return elapsed * (self.total - self.completed) / self.completed
        start, units = self._first
        return (elapsed - start) / (self.completed - units) * (self.total - self.completed)

    def line(self, note: str) -> str:
        """One finished unit as a line: label, done of total, the note, elapsed time and the time left."""
        elapsed = time.perf_counter() - self.started
        count = f"{self.completed:g}/{self.total:g}" if self.total else f"{self.completed:g}"
        timing = f"{clock(elapsed)} elapsed"
        if self.total and 0 < self.completed < self.total:
            timing += f", ~{clock(self.left(elapsed))} left"
        return f"{self.label} [{count}] {note}".rstrip() + f"  ({timing})"


@contextmanager
def progress(
    console: Console,
    label: str,
    total: float | None = None,
    *,
    plan: str = "",
    lines: bool | None = True,
    detail: str = "",
    **fields,
) -> Iterator[Progress]:
    """A command's progress while the block runs: a live bar on a terminal (and, with `lines`, a line per
    finished unit above it); on a pipe or in a log, the lines alone (`lines` None: there only; False: never).
    `total` None: unknown until given.
    `plan`, said first, is what will run and about how long it takes. `detail` is a format string over
    `fields` shown beside the count (``"loss {task.fields[loss]:.3f}"``)."""
    if plan:
        console.print(f"{label}: {plan}", highlight=False, markup=False, soft_wrap=True)
    if not (console.is_terminal or console.is_jupyter):
        yield Progress(console, label, total, lines, None)
        return
    columns = [TextColumn(f"[bold]{label}[/bold]"), TextColumn("{task.fields[now]}"), BarColumn(), MofNCompleteColumn()]
    if detail:
        columns.append(TextColumn(detail))
    columns += [TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Bar(*columns, console=console, transient=True) as bar:
        tracker = Progress(console, label, total, lines, bar)
        if fields:
            bar.update(tracker._task, **fields)
        yield tracker


@contextmanager
def phase_bar(
    console: Console, label: str, total: float | None = None, detail: str = "", lines: bool | None = False, **fields
) -> Iterator[PhaseUpdate]:
    """A phase (trajectories, trained tokens): a transient bar on a terminal; in a log nothing, or with `lines`
    None a line per unit (for phases whose units are few and slow: cold start, evaluation)."""
    with progress(console, label, total, lines=lines, detail=detail, **fields) as tracker:
        yield tracker.update


@contextmanager
def no_bar(label: str, total: float | None = None, detail: str = "", **fields) -> Iterator[PhaseUpdate]:
    """A phase shown nowhere (the default for library callers)."""
    yield lambda **update: None
