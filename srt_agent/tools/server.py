"""A SandboxFusion-compatible HTTP server over a sandbox that runs programs itself (a ServedSandbox: the local
sandbox, Docker): `srt-agent sandbox serve`.

Speaks SandboxFusion's `POST /run_code` and `GET /v1/ping`, so verl's SandboxFusion tool and reward and the
`sandbox-fusion` client work on a machine without Docker. Runs `python` (alias `python3`), `bash`, `nodejs`
and `cpp` (compiled with g++ first, SandboxFusion's `compile_result` and `compile_timeout`) where their
tools are installed (languages.py), with SandboxFusion's `files` and `fetch_files`; its other languages get
`Failed`, a request outside its schema 422. `GET /v1/runtime` reports the sandbox's Python, packages and
limits, `GET /v1/load` what runs and waits.

Every request is answered within its compile and run timeouts of its arrival, queue included (a RunScheduler
decides when programs start; see scheduler.py); a program stopped by load rather than by itself (or never
started) is SandboxFusion's `SandboxError` with a message saying the server was overloaded and `srt_status`
"overloaded", never `TimeLimitExceeded`, which stays for a program that had its time. A request whose run
timeout is at most 5 s (or with `srt_interactive`) is interactive: it has slots of its own. Callers (the
`X-SRT-Caller` header, else the client's address) share the slots fairly. A request whose client
disconnects has its program killed. Responses carry extra fields SandboxFusion clients ignore: `srt_status` and `truncated`
(so SandboxFusionSandbox gets our exact status back) and `srt_queued_s`, `srt_cpu_s`, `srt_cpu_wait_s`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import resource
import signal
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Literal

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, Field, field_validator

from . import languages
from .base import SandboxResult, SandboxStatus, ServedSandbox
from .files import check_names, decode_files, encode_files
from .runtime import DESCRIBE_PROGRAM
from .scheduler import INTERACTIVE_S, RunLoad, RunScheduler
from .threaded_server import served

# SandboxFusion's languages (its server's and its PyPI client's lists), plus our alias `python3`.
SANDBOX_FUSION_LANGUAGES = (
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
    "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script",
    "jest", "verilog", "python_gpu", "lean", "swift", "racket", "gtest", "react",
)  # fmt: skip
ALIASES = {"python3": "python"}  # request language -> the sandbox's
DISCONNECT_POLL_S = 1.0
CALLER_HEADER = "x-srt-caller"  # who a request is from, for the fair share (default: the client's address)


class RunCodeRequest(BaseModel):
    """SandboxFusion's `/run_code` request. `files` maps names in the run's working directory to base64
    (null entries skipped); `fetch_files` names files to send back. Bad names or base64 get 422."""

    code: str
    language: Literal[SANDBOX_FUSION_LANGUAGES + ("python3",)]  # type: ignore[valid-type]
    compile_timeout: float = 10
    run_timeout: float | None = None  # None: the server's default
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)
    srt_interactive: bool = False  # srt-agent's own: start it in the interactive slots whatever its timeout

    @field_validator("fetch_files")
    @classmethod
    def _fetch_names(cls, names: list[str]) -> list[str]:
        return check_names(names)


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    srt_status: SandboxStatus | None = None
    truncated: bool = False
    srt_queued_s: float | None = None
    srt_cpu_s: float | None = None
    srt_cpu_wait_s: float | None = None


OUTPUT_CUT = "the program's output passed this server's cap and it was stopped: stdout and stderr are cut"


def _command_result(result: SandboxResult) -> CommandRunResult:
    """One phase's outcome as SandboxFusion's CommandRunResult (a run stopped at the output cap reads as a
    program killed by SIGKILL, as SandboxFusion clients expect)."""
    if result.status in ("sandbox_error", "overloaded"):
        return CommandRunResult(
            status="Error", execution_time=result.wall_s, stdout=result.stdout, stderr=result.stderr
        )
    return CommandRunResult(
        status="TimeLimitExceeded" if result.status == "timeout" else "Finished",
        execution_time=result.wall_s,
        return_code=-signal.SIGKILL if result.status == "output_limit" else result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
    )


def response_from_result(
    result: SandboxResult, load: RunLoad | None = None, fetch: tuple[str, ...] = ()
) -> RunCodeResponse:
    """Map a SandboxResult onto SandboxFusion's response (the inverse of `result_from_response`).

    A compiled program's compiler comes back as `compile_result` (alone, when it did not compile); a run
    stopped at the output cap has `message` and `srt_status` say the output was cut; `load` fills the
    `srt_*_s` fields.
    """
    figures = {}
    if load is not None:
        figures = dict(srt_queued_s=load.queued_s, srt_cpu_s=load.cpu_s, srt_cpu_wait_s=load.cpu_wait_s)
    compiled = _command_result(result.compile) if result.compile is not None else None
    if result.status == "compile_error" or (result.compile is not None and result.compile.status != "ok"):
        message = "the program did not compile" if result.status == "compile_error" else result.stderr
        status = "SandboxError" if result.status in ("sandbox_error", "overloaded") else "Failed"
        return RunCodeResponse(
            status=status, message=message, compile_result=compiled, srt_status=result.status, **figures
        )
    if result.status in ("sandbox_error", "overloaded"):  # not the program's doing: SandboxError, never a timeout
        run = _command_result(result)
        message = result.stderr
        if result.status == "overloaded":  # the scheduler's note, after what the program printed
            message = (result.stderr.strip().splitlines() or ["the sandbox server was overloaded"])[-1]
        return RunCodeResponse(
            status="SandboxError", message=message, run_result=run, srt_status=result.status, **figures
        )
    missing = [name for name in fetch if name not in result.files]
    message = OUTPUT_CUT if result.status == "output_limit" else ""
    if missing:
        message = "; ".join(
            filter(None, [message, f"not fetched (missing, not a file, or over the size cap): {missing}"])
        )
    return RunCodeResponse(
        status="Success" if result.status == "ok" else "Failed",
        message=message,
        compile_result=compiled,
        run_result=_command_result(result),
        files=encode_files(result.files),
        srt_status=result.status,
        truncated=result.truncated,
        **figures,
    )


def _rejected(message: str) -> RunCodeResponse:
    return RunCodeResponse(status="SandboxError", message=message, srt_status="sandbox_error")


def _timed_out_at_once() -> RunCodeResponse:
    """SandboxFusion's answer to a run timeout of zero or less: the run is over before it starts."""
    run = CommandRunResult(status="TimeLimitExceeded", execution_time=0.0, stdout="", stderr="")
    return RunCodeResponse(status="Failed", run_result=run, srt_status="timeout")


@dataclasses.dataclass
class ServerConfig:
    """What the server runs with: the base sandbox (a ServedSandbox: local or Docker), how many programs run at
    once (`workers`, default from the machine's cores and memory; `fresh_slots` of them starting, each at
    normal priority for its first `quantum_s` of CPU; `interactive_slots` more for interactive requests, see
    scheduler.py), caps on what requests may ask, and the seconds in-flight requests get to finish when the
    server stops (`shutdown_grace_s`)."""

    sandbox: ServedSandbox
    workers: int | None = None
    fresh_slots: int | None = None
    quantum_s: float = 0.2
    interactive_slots: int | None = None
    max_timeout_s: float = 60.0
    max_memory_mb: int = 4096
    max_request_bytes: int = 8 << 20
    shutdown_grace_s: float = 2.0

    def languages(self) -> list[str]:
        """The request languages this server runs (aliases included)."""
        runnable = self.sandbox.languages()
        return [*runnable, *(alias for alias, name in ALIASES.items() if name in runnable)]


def create_app(config: ServerConfig) -> FastAPI:
    """The FastAPI app. Each request may lower or raise timeout and memory up to the config's caps.

    Faults stay with their request: a malformed body gets 422, one over `max_request_bytes` 413 (before it
    is read), and a sandbox that raises a SandboxError answer; the other requests never notice.
    """
    if (config.workers is not None and config.workers < 1) or config.max_request_bytes < 1:
        raise ValueError(
            f"workers and max_request_bytes must be >= 1, got {config.workers}, {config.max_request_bytes}"
        )
    _raise_open_files()
    scheduler = RunScheduler(
        config.workers, config.fresh_slots, config.quantum_s, interactive_slots=config.interactive_slots
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        scheduler.shutdown()
        close = getattr(config.sandbox, "close", None)  # a sandbox holding warm containers gives them back
        if close is not None:
            close()

    app = FastAPI(title="srt-agent sandbox (SandboxFusion-compatible)", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    app.state.scheduler = scheduler

    runtime: dict = {}

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.get("/v1/runtime")
    async def describe_runtime() -> dict:
        """What programs run with: languages, the sandbox's Python and its packages (as seen inside), limits."""
        if "python" not in runtime:  # asked inside the sandbox once, kept once it answered
            runtime.update(await _runtime(config))
        return {**runtime, "scheduler": scheduler.stats()}

    @app.get("/v1/load")
    async def load() -> dict:
        """Programs running and waiting now, and counts since the start (the same for every sandbox)."""
        return {**scheduler.stats(), "sandbox": type(config.sandbox).__name__}

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest, http: Request) -> RunCodeResponse:
        return await _run_code(config, scheduler, request, http)

    return app


def _raise_open_files() -> None:
    """Lift the soft limit on open files to the hard one: hundreds of calls at once hold a connection each and
    a few pipes per program (many systems start processes with a soft limit of 1024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (OSError, ValueError):
            pass


async def _runtime(config: ServerConfig) -> dict:
    """Languages, the sandbox's Python as programs inside it see it, whether runs are sandboxed, and limits."""
    run = lambda: config.sandbox.run(DESCRIBE_PROGRAM, timeout_s=max(config.sandbox.timeout_s, 30.0))  # noqa: E731
    result = await asyncio.to_thread(run)
    if not result.ok:
        raise HTTPException(503, f"the sandbox could not report its runtime ({result.status}): {result.stderr[-2000:]}")
    python = json.loads(result.stdout)  # `executable` as programs see it; where it comes from beside it
    python.update(config.sandbox.origin())
    return dict(
        languages=sorted(config.languages()),
        python=python,
        sandboxed=config.sandbox.sandboxed,
        limits={
            "default_timeout_s": config.sandbox.timeout_s, "max_timeout_s": config.max_timeout_s,
            "default_memory_mb": config.sandbox.memory_mb, "max_memory_mb": config.max_memory_mb,
            "max_output_bytes": config.sandbox.max_output_bytes, "workdir_mb": config.sandbox.tmp_mb,
            "max_fetch_bytes": config.sandbox.max_file_mb << 20, "max_request_bytes": config.max_request_bytes,
        },
    )  # fmt: skip


async def _run_code(
    config: ServerConfig, scheduler: RunScheduler, request: RunCodeRequest, http: Request
) -> RunCodeResponse:
    """One `/run_code` request through the scheduler, its timeouts and memory held to the config's caps and
    its answer due `compile_timeout + run_timeout` after it arrived."""
    arrival = getattr(http.state, "arrival", None) or time.monotonic()
    runnable = config.languages()
    if request.language not in runnable:
        why = languages.missing_tools(request.language) if request.language in languages.LANGUAGES else None
        message = f"language {request.language!r} is not supported by this server (it runs {', '.join(runnable)})"
        return RunCodeResponse(status="Failed", message=f"{message}: {why}" if why else message)
    if request.run_timeout is not None and request.run_timeout <= 0:
        return _timed_out_at_once()
    try:
        files = decode_files(request.files)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    if sum(map(len, files.values())) > config.sandbox.tmp_mb << 20:
        raise HTTPException(413, f"the files take over the run's {config.sandbox.tmp_mb} MB working directory")
    sandbox = config.sandbox
    if request.memory_limit_MB > 0 and request.memory_limit_MB != sandbox.memory_mb:
        sandbox = dataclasses.replace(sandbox, memory_mb=min(request.memory_limit_MB, config.max_memory_mb))
    timeout = min(request.run_timeout or sandbox.timeout_s, config.max_timeout_s)
    compile_timeout = min(max(request.compile_timeout, 0.0), config.max_timeout_s)
    fetch = tuple(dict.fromkeys(request.fetch_files))
    language = ALIASES.get(request.language, request.language)
    caller = http.headers.get(CALLER_HEADER) or (http.client.host if http.client else "")
    interactive = request.srt_interactive or timeout <= INTERACTIVE_S
    work = _work(sandbox, request, files, fetch, language, timeout, compile_timeout, interactive)
    job = scheduler.submit(work, arrival + compile_timeout + timeout, timeout, sandbox.memory_mb, caller, interactive)
    try:
        outcome = await _unless_disconnected(job.future, http)
    except asyncio.CancelledError:  # the server stops: the program goes too
        scheduler.cancel(job)
        raise
    except Exception as exc:  # noqa: BLE001 - the sandbox failed for this request only
        return _rejected(f"the sandbox failed: {type(exc).__name__}: {exc}")
    if outcome is None:  # nobody reads this answer
        scheduler.cancel(job)
        return _rejected("the client disconnected; its program was killed")
    return response_from_result(*outcome, fetch=fetch)


def _work(sandbox, request: RunCodeRequest, files: dict, fetch: tuple, language: str, timeout: float, compile_s: float,
          interactive: bool = False):  # fmt: skip
    """The request's run as the scheduler calls it, `(deadline, watch) -> SandboxResult`; a sandbox whose
    `run` takes no deadline (a plain CodeSandbox) gets the time left as its timeout."""
    extra = {"files": files, "fetch_files": fetch, "language": language}
    extra = {key: value for key, value in extra.items() if value and value != "python"}  # plain runs: run(code, …)
    takes = inspect.signature(sandbox.run).parameters
    if language in languages.LANGUAGES and languages.LANGUAGES[language].compile is not None:
        extra["compile_timeout_s"] = max(compile_s, 0.1)

    if "interactive" in takes:
        extra["interactive"] = interactive

    def work(deadline: float, watch) -> SandboxResult:
        if "deadline" in takes:
            return sandbox.run(
                request.code, stdin=request.stdin or "", timeout_s=timeout, deadline=deadline, watch=watch, **extra
            )
        left = min(timeout, deadline - time.monotonic())
        if left <= 0:
            return SandboxResult(status="timeout", stderr="no time was left to run it")
        return sandbox.run(request.code, stdin=request.stdin or "", timeout_s=left, **extra)

    return work


async def _unless_disconnected(future, http: Request) -> tuple[SandboxResult, RunLoad] | None:
    """The job's outcome, or None when its client disconnects first."""
    waiting = asyncio.wrap_future(future)
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=DISCONNECT_POLL_S)
        if done:
            return waiting.result()
        if await http.is_disconnected():
            return None


class BodyLimit:
    """ASGI middleware: refuse request bodies over `max_bytes` with 413 before reading them.

    A declared Content-Length over the cap is refused at once; a chunked body is read here, up to the cap.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["arrival"] = time.monotonic()  # the request's deadlines count from here
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit():  # the HTTP layer holds the body to its declared length
            if int(declared) > self.max_bytes:
                await _plain_error(
                    send, 413, f"request body of {int(declared)} bytes is over this server's limit of {self.max_bytes}"
                )
            else:
                await self.app(scope, receive, send)
            return
        body, more = bytearray(), True  # chunked: read it here, up to the cap
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await _plain_error(send, 413, f"request body is over this server's limit of {self.max_bytes} bytes")
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


async def _plain_error(send, status: int, message: str) -> None:
    payload = json.dumps({"detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@contextmanager
def running_server(config: ServerConfig, *, host: str = "127.0.0.1", port: int | None = None) -> Iterator[str]:
    """Serve in a background thread (on a free port unless given); yields the base URL."""
    with served(create_app(config), "sandbox server", host, port) as url:
        yield url


def serve(config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info") -> None:
    """Run the server until interrupted."""
    import uvicorn

    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_grace_s,  # then the rest is cancelled and its programs killed
    )
