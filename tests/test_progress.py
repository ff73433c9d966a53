"""The one progress helper: on a terminal a live bar; in a log or a pipe one line per finished unit (what,
done of total, elapsed, time left), and nothing for a fine-grained phase (a transient bar there leaves a blank
line behind each phase)."""

import io

from rich.console import Console

from srt_agent.console import phase_bar, progress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100), out


def _run_phase(terminal: bool) -> str:
    console, out = _console(terminal)
    with phase_bar(console, "rollouts", total=4) as update:
        for _ in range(4):
            update(advance=1)
    return out.getvalue()


def test_a_phase_leaves_nothing_behind_in_a_log_and_draws_on_a_terminal():
    assert _run_phase(terminal=False) == ""
    assert "rollouts" in _run_phase(terminal=True)


def test_a_log_gets_one_line_per_finished_unit_with_done_of_total_and_time_left():
    console, out = _console(terminal=False)
    with progress(console, "engine", total=3) as work:
        for method in ("none", "srt", "suffix"):
            work.now(f"{method} b=1")
            work.done(f"{method} b=1: 10.0 tok/s")
    lines = out.getvalue().splitlines()
    assert [line.split("]")[0] for line in lines] == ["engine [1/3", "engine [2/3", "engine [3/3"]
    assert "srt b=1: 10.0 tok/s" in lines[1] and "elapsed, ~" in lines[1] and "left" in lines[1]
    assert "left" not in lines[2]  # nothing left after the last unit


def test_a_terminal_gets_the_bar_and_the_lines():
    console, out = _console(terminal=True)
    with progress(console, "engine", total=2) as work:
        work.now("srt b=8 epoch 1")
        work.done("srt b=8 epoch 1: 12.0 tok/s")
        work.add_total(1)
        work.done()
        work.done()
    text = out.getvalue()
    assert "engine [1/2] srt b=8 epoch 1: 12.0 tok/s" in text and "engine [3/3]" in text


def test_a_slow_phase_gets_a_line_per_unit_in_a_log_only():
    console, out = _console(terminal=False)
    with phase_bar(console, "cold start SFT", None, "loss {task.fields[loss]:.3f}", lines=None, loss=0.0) as update:
        for step in (1, 2):
            update(completed=step, total=2, loss=1.0 / step)
    assert [line.split("  (")[0] for line in out.getvalue().splitlines()] == [
        "cold start SFT [1/2] loss 1.000",
        "cold start SFT [2/2] loss 0.500",
    ]
    console, out = _console(terminal=True)
    with phase_bar(console, "cold start SFT", 2, lines=None) as update:
        update(advance=2)
    assert "[2/2]" not in out.getvalue()  # a terminal has the bar
