"""A SandboxFusion-compatible HTTP server on top of the local sandbox (or Docker): `srt-agent sandbox serve`.

Speaks SandboxFusion's `POST /run_code` and `GET /v1/ping`, so verl's SandboxFusion tool and the
`sandbox-fusion` client work on a machine without Docker. Runs `python` (alias `python3`) and `bash`,
with SandboxFusion's `files` and `fetch_files`; its other languages get `Failed`, a request outside its
schema 422. `GET /v1/runtime` reports the sandbox's Python and packages. Requests run concurrently in a
thread pool (each run is its own sandboxed process). Responses carry two extra fields SandboxFusion
clients ignore, `srt_status` and `truncated`, so SandboxFusionSandbox gets our exact status back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from typing import Literal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field, field_validator

from .base import SandboxResult, SandboxStatus
from .docker_sandbox import DockerSandbox
from .files import check_names, decode_files, encode_files
from .local import LocalSandbox
from .runtime import DESCRIBE_PROGRAM
from .threaded_server import served

# SandboxFusion's languages (its server's and its PyPI client's lists), plus our alias `python3`.
SANDBOX_FUSION_LANGUAGES = (
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
    "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script",
    "jest", "verilog", "python_gpu", "lean", "swift", "racket", "gtest", "react",
)  # fmt: skip
RUNNABLE = {"python": "python", "python3": "python", "bash": "bash"}  # request language -> LocalSandbox's


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


OUTPUT_CUT = "the program's output passed this server's cap and it was stopped: stdout and stderr are cut"


def response_from_result(result: SandboxResult, fetch_files: tuple[str, ...] = ()) -> RunCodeResponse:
    """Map a SandboxResult onto SandboxFusion's response (the inverse of `result_from_response`).

    A run stopped at the output cap reads as SandboxFusion clients expect of a killed program
    (`Finished`, return code -9, `Failed`), with `message` and `srt_status` saying the output was cut.
    """
    if result.status == "sandbox_error":
        run = CommandRunResult(status="Error", execution_time=result.wall_s, stdout=result.stdout, stderr=result.stderr)
        return RunCodeResponse(status="SandboxError", message=result.stderr, run_result=run, srt_status=result.status)
    cut = result.status == "output_limit"
    run = CommandRunResult(
        status="TimeLimitExceeded" if result.status == "timeout" else "Finished",
        execution_time=result.wall_s,
        return_code=-signal.SIGKILL if cut else result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
    )
    missing = [name for name in fetch_files if name not in result.files]
    message = OUTPUT_CUT if cut else ""
    if missing:
        message = "; ".join(
            filter(None, [message, f"not fetched (missing, not a file, or over the size cap): {missing}"])
        )
    return RunCodeResponse(
        status="Success" if result.status == "ok" else "Failed",
        message=message,
        run_result=run,
        files=encode_files(result.files),
        srt_status=result.status,
        truncated=result.truncated,
    )


def _rejected(message: str) -> RunCodeResponse:
    return RunCodeResponse(status="SandboxError", message=message, srt_status="sandbox_error")


def _timed_out_at_once() -> RunCodeResponse:
    """SandboxFusion's answer to a run timeout of zero or less: the run is over before it starts."""
    run = CommandRunResult(status="TimeLimitExceeded", execution_time=0.0, stdout="", stderr="")
    return RunCodeResponse(status="Failed", run_result=run, srt_status="timeout")


@dataclasses.dataclass
class ServerConfig:
    """What the server runs with: the base sandbox (local or Docker), the pool size, caps on what requests may ask."""

    sandbox: LocalSandbox | DockerSandbox
    workers: int = 4
    max_timeout_s: float = 60.0
    max_memory_mb: int = 4096
    max_request_bytes: int = 8 << 20


def create_app(config: ServerConfig) -> FastAPI:
    """The FastAPI app. Each request may lower or raise timeout and memory up to the config's caps.

    Faults stay with their request: a malformed body gets 422, one over `max_request_bytes` 413 (before it
    is read), and a sandbox that raises a SandboxError answer; the other requests never notice.
    """
    if config.workers < 1 or config.max_request_bytes < 1:
        raise ValueError(
            f"workers and max_request_bytes must be >= 1, got {config.workers}, {config.max_request_bytes}"
        )
    pool = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="sandbox")

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="srt-agent sandbox (SandboxFusion-compatible)", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)

    runtime: dict = {}

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.get("/v1/runtime")
    async def describe_runtime() -> dict:
        """What programs run with: languages, the sandbox's Python and its packages (as seen inside), limits."""
        if "python" not in runtime:  # asked inside the sandbox once, kept once it answered
            runtime.update(await _runtime(config, pool))
        return runtime

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest) -> RunCodeResponse:
        return await _run_code(config, pool, request)

    return app


async def _runtime(config: ServerConfig, pool: ThreadPoolExecutor) -> dict:
    """Languages, the sandbox's Python as programs inside it see it, whether runs are sandboxed, and limits."""
    run = lambda: config.sandbox.run(DESCRIBE_PROGRAM, timeout_s=max(config.sandbox.timeout_s, 30.0))  # noqa: E731
    result = await asyncio.get_running_loop().run_in_executor(pool, run)
    if not result.ok:
        raise HTTPException(503, f"the sandbox could not report its runtime ({result.status}): {result.stderr[-2000:]}")
    python = json.loads(result.stdout)  # `executable` as programs see it; where it comes from beside it
    if isinstance(config.sandbox, DockerSandbox):
        python["image"], sandboxed = config.sandbox.image, True
    else:
        python["host_executable"], sandboxed = str(config.sandbox.interpreter), config.sandbox.sandboxed
    return dict(
        languages=sorted(RUNNABLE),
        python=python,
        sandboxed=sandboxed,
        limits={
            "default_timeout_s": config.sandbox.timeout_s, "max_timeout_s": config.max_timeout_s,
            "default_memory_mb": config.sandbox.memory_mb, "max_memory_mb": config.max_memory_mb,
            "max_output_bytes": config.sandbox.max_output_bytes, "workdir_mb": config.sandbox.tmp_mb,
            "max_fetch_bytes": config.sandbox.max_file_mb << 20, "max_request_bytes": config.max_request_bytes,
        },
    )  # fmt: skip


async def _run_code(config: ServerConfig, pool: ThreadPoolExecutor, request: RunCodeRequest) -> RunCodeResponse:
    """One `/run_code` request on the pool, its timeout and memory held to the config's caps."""
    if request.language not in RUNNABLE:
        message = f"language {request.language!r} is not supported by this server (it runs {', '.join(RUNNABLE)})"
        return RunCodeResponse(status="Failed", message=message)
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
    fetch = tuple(dict.fromkeys(request.fetch_files))
    extra = {"files": files, "fetch_files": fetch, "language": RUNNABLE[request.language]}
    extra = {key: value for key, value in extra.items() if value and value != "python"}  # plain runs: run(code, …)
    loop = asyncio.get_running_loop()
    try:
        result = await loop.run_in_executor(
            pool, lambda: sandbox.run(request.code, stdin=request.stdin or "", timeout_s=timeout, **extra)
        )
    except Exception as exc:  # noqa: BLE001 - the sandbox failed for this request only
        return _rejected(f"the sandbox failed: {type(exc).__name__}: {exc}")
    return response_from_result(result, fetch)


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

    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level)
