"""Phase bars: drawn on a terminal, absent where the console is a log file or a pipe (a transient bar there
leaves a blank line behind each phase)."""

import io

from rich.console import Console

from srt_agent.rl.progress import phase_bar


def _run_phase(terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=80)
    with phase_bar(console, "rollouts", total=4) as update:
        for _ in range(4):
            update(advance=1)
    return out.getvalue()


def test_a_phase_leaves_nothing_behind_in_a_log_and_draws_on_a_terminal():
    assert _run_phase(terminal=False) == ""
    assert "rollouts" in _run_phase(terminal=True)
