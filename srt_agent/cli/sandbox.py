"""`srt-agent sandbox …`: serve the sandbox, run one program in it, measure it."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..tools.factory import SANDBOX_KINDS, served_kinds
from .common import PLAIN, console, reported, sandbox_app, write_json


@sandbox_app.command("serve")
def sandbox_serve(
    port: int = typer.Option(8080, help="TCP port."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (0.0.0.0 for all)."),
    backend: str = typer.Option(
        "local",
        help=f"Where programs run: {' or '.join(served_kinds())} (local: bubblewrap; docker: a container each).",
    ),
    workers: int | None = typer.Option(
        None, min=1, help="Programs running at once (default: 64 per core, at most one per 128 MiB of memory)."
    ),
    fresh_slots: int | None = typer.Option(
        None, min=1, help="Programs starting at once: in their first 0.5 s and --quantum-s (default: 2 per core)."
    ),
    quantum_s: float = typer.Option(
        0.2, help="CPU seconds a program runs at normal priority; then at idle priority (SCHED_IDLE)."
    ),
    interactive_slots: int | None = typer.Option(
        None,
        min=0,
        help="Fresh slots of interactive calls (run_timeout <= 5 s) beyond the others (default: 1 per core).",
    ),
    timeout_s: float = typer.Option(10.0, help="Default run timeout; requests may ask for up to --max-timeout-s."),
    max_timeout_s: float = typer.Option(60.0, help="Cap on a request's run_timeout."),
    memory_mb: int = typer.Option(512, help="Default memory limit; requests may ask for up to --max-memory-mb."),
    max_memory_mb: int = typer.Option(4096, help="Cap on a request's memory_limit_MB."),
    max_output_bytes: int = typer.Option(65536, help="Cap on stdout+stderr per run."),
    max_request_bytes: int = typer.Option(8 << 20, min=1, help="Larger request bodies are refused (413)."),
    allow_unsandboxed: bool = typer.Option(
        False, help="local: run without bubblewrap if it is missing (no isolation)."
    ),
    python: str | None = typer.Option(
        None,
        help="local: interpreter or venv programs run with (default: the sandbox runtime when built, see docs/sandbox.md).",
    ),
    image: str | None = typer.Option(
        None, help="docker: the image (default: the one scripts/install_docker.sh builds)."
    ),
):
    """A SandboxFusion-compatible server (/run_code, /v1/ping, /v1/runtime) on any sandbox that runs programs
    itself: the local bubblewrap sandbox or Docker."""
    from ..tools import SandboxUnavailable, make_sandbox
    from ..tools.server import ServerConfig, serve

    options = {"timeout_s": timeout_s, "memory_mb": memory_mb, "max_output_bytes": max_output_bytes}
    given = {"allow_unsandboxed": allow_unsandboxed, "python": python, "image": image}
    options.update((name, value) for name, value in given.items() if value)  # a backend refuses those it lacks
    with reported(SandboxUnavailable, ValueError, code=1, message=PLAIN):
        if backend not in served_kinds():
            raise ValueError(f"--backend {backend!r}: choose {' or '.join(served_kinds())}")
        sandbox = make_sandbox(backend, **options)
    for name, value in sandbox.origin().items():
        console.print(f"sandbox {name}: {value}", highlight=False)
    config = ServerConfig(
        sandbox,
        workers=workers,
        fresh_slots=fresh_slots,
        quantum_s=quantum_s,
        interactive_slots=interactive_slots,
        max_timeout_s=max_timeout_s,
        max_memory_mb=max_memory_mb,
        max_request_bytes=max_request_bytes,
    )
    serve(config, host=host, port=port)


@sandbox_app.command("run")
def sandbox_run(
    program: Path = typer.Argument(..., help="A program file to run ('-' reads the program from stdin)."),
    kind: str = typer.Option("local", help=f"Sandbox: {', '.join(SANDBOX_KINDS)}."),
    timeout_s: float = typer.Option(10.0, help="Wall-clock limit."),
    language: str = typer.Option("python", help="python, bash, nodejs or cpp (docker: python, bash)."),
    endpoint: list[str] = typer.Option(
        [], help="sandbox_fusion: a server URL (repeat it for several; default $SANDBOX_FUSION_ENDPOINT)."
    ),
):
    """Run one program in a sandbox and print its SandboxResult as JSON."""
    import sys

    from ..tools import SandboxUnavailable, make_sandbox

    code = sys.stdin.read() if str(program) == "-" else program.read_text()
    with reported(SandboxUnavailable, ValueError, code=1, message=PLAIN):
        sandbox = make_sandbox(kind, timeout_s=timeout_s, **({"endpoint": endpoint} if endpoint else {}))
        options = {"language": language} if language != "python" else {}
        result = sandbox.run(code, **options)
    print(json.dumps(result.to_dict(), indent=2))


@sandbox_app.command("bench")
def sandbox_bench(
    runs: int = typer.Option(20, min=1, help="Programs per measurement."),
    workers: list[int] = typer.Option([1, 4], help="Concurrent callers for the throughput runs."),
    server: bool = typer.Option(True, help="Also measure through `sandbox serve` (started in-process)."),
    concurrency: int | None = typer.Option(
        None, min=1, help="Load mode: send this many programs at once, then a print(1) probe (see --url)."
    ),
    url: str | None = typer.Option(
        None, help="Load mode: any SandboxFusion-compatible server (default: `sandbox serve` started in-process)."
    ),
    program: str = typer.Option("busy", help="Load mode: busy (an endless loop), print, sleep, or Python code."),
    run_timeout: float = typer.Option(10.0, help="Load mode: each program's run_timeout."),
    client_timeout: float | None = typer.Option(
        None, help="Load mode: seconds a client waits (default: compile + run timeouts + 10, as verl's client)."
    ),
    probe_after: float = typer.Option(1.0, help="Load mode: seconds after the flood that the probe is sent."),
    probe_every: float | None = typer.Option(
        None, help="Load mode: send print(1) probes one after another this often, during the flood and --after it."
    ),
    probe_run_timeout: float = typer.Option(5.0, help="Load mode: the probes' run_timeout (<= 5 s: interactive)."),
    after: float = typer.Option(10.0, help="Load mode, with --probe-every: seconds of probes after the flood."),
    backend: str = typer.Option(
        "local", help=f"Load mode: the in-process server's sandbox ({', '.join(served_kinds())})."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the result here."),
):
    """Latency and throughput of the local sandbox (and its server) against a bare Python start; with
    --concurrency, how a server answers a flood: the share answered in time, p50/p99, statuses, a probe."""
    from contextlib import nullcontext

    from ..tools import LocalSandbox, SandboxFusionSandbox, SandboxUnavailable, make_sandbox
    from ..tools.server import ServerConfig, running_server

    if concurrency is not None:
        from ..bench.sandbox_load import load_bench

        with reported(SandboxUnavailable, ValueError, code=1, message=PLAIN):
            served = None if url else make_sandbox(backend, timeout_s=run_timeout)
        context = nullcontext(url) if url else running_server(ServerConfig(served))
        with context as endpoint:
            options = dict(concurrency=concurrency, program=program, run_timeout=run_timeout, after_s=after)
            probes = dict(probe_after_s=probe_after, probe_every_s=probe_every, probe_run_timeout=probe_run_timeout)
            result = load_bench(endpoint, **options, client_timeout=client_timeout, **probes)
        result["backend"] = url or backend
    else:
        from ..bench.sandbox import bench_sandboxes

        local = LocalSandbox(timeout_s=30)
        context = running_server(ServerConfig(local, workers=max(workers))) if server else nullcontext(None)
        with context as endpoint:
            sandboxes = {"local": local}
            if endpoint:
                sandboxes["server"] = SandboxFusionSandbox(endpoint, timeout_s=30)
            result = bench_sandboxes(sandboxes, runs=runs, workers=tuple(workers))
    console.print_json(data=result)
    write_json(result, json_out)
