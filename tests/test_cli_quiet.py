"""The main job's console keeps the project's lines; what libraries print goes to the run folder's log."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, warnings
    from pathlib import Path
    from rich.console import Console
    from srt_agent.cli.quiet import third_party_output_to

    console = Console(width=100)
    log = Path(sys.argv[1])
    failing = sys.argv[2] == "fail"
    with third_party_output_to(log, console, verbose=sys.argv[2] == "verbose"):
        console.print("the project's line")
        print("a library's print")
        os.write(2, b"native code on stderr\\n")
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        warnings.warn_explicit("a library's warning", UserWarning, "/elsewhere/lib.py", 1)
        warnings.warn_explicit("the project's warning", UserWarning, str(Path(__import__('srt_agent').__file__)), 1)
        if failing:
            raise RuntimeError("it broke")
    print("after the block")
    """
)


def run(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "third-party.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(log), mode], capture_output=True, text=True, timeout=120)
    return done, log.read_text() if log.exists() else ""


def test_libraries_output_goes_to_the_log_and_the_project_lines_stay(tmp_path):
    done, log = run(tmp_path, "quiet")
    assert done.returncode == 0, done.stderr
    shown = done.stdout + done.stderr
    assert "the project's line" in shown and "the project's warning" in shown and "after the block" in shown
    for noise in ("a library's print", "native code on stderr", "a child process", "a library's warning"):
        assert noise not in shown
        assert noise in log
    assert "the project's line" not in log


def test_a_failure_still_prints_what_failed_and_names_the_log(tmp_path):
    done, _ = run(tmp_path, "fail")
    assert done.returncode == 1
    assert "RuntimeError: it broke" in done.stderr
    assert "third-party.log" in done.stdout


def test_verbose_shows_everything(tmp_path):
    done, log = run(tmp_path, "verbose")
    assert done.returncode == 0
    assert "a library's print" in done.stdout and "native code on stderr" in done.stderr
    assert log == ""
