"""Every command that starts a model keeps its console to the project's lines; what libraries print goes to
a log (the run folder's, or runs/<command>/), and `--verbose` shows it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import typer

from srt_agent.cli import app

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys, warnings
    from pathlib import Path
    from rich.console import Console
    from srt_agent.cli.quiet import third_party_output_to

    console = Console(width=100)
    log = Path(sys.argv[1])
    failing = sys.argv[2] == "fail"
    code = {"exit": 1, "done": 0}.get(sys.argv[2])
    with third_party_output_to(log, console, verbose=sys.argv[2] == "verbose"):
        console.print("the project's line")
        print("a library's print")
        os.write(2, b"native code on stderr\\n")
        subprocess.run([sys.executable, "-c", "print('a child process')"], check=True)
        warnings.warn_explicit("a library's warning", UserWarning, "/elsewhere/lib.py", 1)
        warnings.warn_explicit("the project's warning", UserWarning, str(Path(__import__('srt_agent').__file__)), 1)
        if failing:
            raise RuntimeError("it broke")
        if code is not None:
            sys.exit(code)
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


def test_an_exit_with_a_failing_code_names_the_log(tmp_path):
    failed, _ = run(tmp_path, "exit")
    assert failed.returncode == 1 and "third-party.log" in failed.stdout
    done, _ = run(tmp_path, "done")
    assert done.returncode == 0 and "third-party.log" not in done.stdout


MODEL_COMMANDS = [
    ["train"],
    ["eval"],
    ["serve"],
    ["rollout"],
    *(["bench", name] for name in ("engine", "prefix", "update", "roofline", "ablation", "paper", "vllm", "gpu")),
]


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=" ".join)
def test_every_command_that_starts_a_model_takes_verbose(command):
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]
    verbose = next(p for p in group.params if p.name == "verbose")
    assert verbose.opts == ["--verbose"] and "third-party.log" in verbose.help


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(tmp_path, *options: str) -> tuple[str, str]:
    """`srt-agent serve` on the tiny model until it has answered one request; its console, and its log."""
    env = tmp_path / "tiny.yaml"
    env.write_text("name: tiny\nmodel: tiny-llama\nengine: {backend: engine, max_context: 256, calibrate: false}\n")
    port = free_port()
    argv = [sys.executable, "-m", "srt_agent.cli", "serve", str(env), "--port", str(port), *options]
    server = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        body = {"model": "tiny-llama", "prompt": "x", "max_tokens": 2}
        assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        server.send_signal(signal.SIGINT)
        console = server.communicate(timeout=60)[0]
    log = tmp_path / "runs" / "serve" / "third-party.log"
    return console, log.read_text() if log.exists() else ""


def test_serve_keeps_its_console_and_logs_uvicorn_and_the_libraries(tmp_path):
    console, log = serve(tmp_path)
    ours = ("backend for srt: our engine", "serving tiny-llama on http://127.0.0.1:", "uvicorn's and the libraries'")
    lines = [line for line in console.splitlines() if line.strip()]
    assert [line.startswith(ours) for line in lines] == [True] * 3, console
    assert os.path.join("runs", "serve", "third-party.log") in lines[-1]
    assert "Uvicorn running on" in log and "POST /v1/completions" in log


def test_serve_verbose_shows_everything(tmp_path):
    console, log = serve(tmp_path, "--verbose")
    assert "serving tiny-llama" in console and "Uvicorn running on" in console and log == ""
