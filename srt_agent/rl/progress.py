"""Progress bars for a run's phases: one transient bar at a time, with elapsed time and time left."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

#: moves a phase's bar: ``update(advance=n)``, or ``update(completed=, total=, <field>=…)``
PhaseUpdate = Callable[..., None]
#: opens a phase's bar: ``with phase(label, total) as update: …``
Phase = Callable[..., "contextmanager[PhaseUpdate]"]


@contextmanager
def phase_bar(
    console: Console, label: str, total: float | None = None, detail: str = "", **fields
) -> Iterator[PhaseUpdate]:
    """A bar for `label` while the block runs (`total` None: unknown until an update gives it); `detail` is
    a format string over `fields` shown beside the count (e.g. ``"loss {task.fields[loss]:.3f}"``). Where the
    console is not a terminal (a log file, a pipe) there is no bar: a transient one would leave blank lines."""
    if not (console.is_terminal or console.is_jupyter):
        yield lambda **update: None
        return
    columns = [TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn()]
    if detail:
        columns.append(TextColumn(detail))
    columns += [TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=True) as progress:
        bar = progress.add_task("", total=total, **fields)
        yield lambda **update: progress.update(bar, **update)


@contextmanager
def no_bar(label: str, total: float | None = None, detail: str = "", **fields) -> Iterator[PhaseUpdate]:
    """A phase shown nowhere (the default for library callers)."""
    yield lambda **update: None
