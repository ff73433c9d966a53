"""Docker as the code sandbox: a throwaway container per run, no network, memory/CPU/pids limits.

Needs the `docker` Python package (`pip install 'srt-agent[docker]'`) and a reachable Docker engine;
construction fails with SandboxUnavailable otherwise.
"""

from __future__ import annotations

import io
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .base import SandboxResult, SandboxUnavailable, is_memory_error

_RUN = "python -u /sandbox/main.py < /sandbox/stdin"


def _program_archive(code: str, stdin: str) -> bytes:
    """A tar holding sandbox/main.py and sandbox/stdin, for `put_archive` at `/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in (("sandbox/main.py", code), ("sandbox/stdin", stdin)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class DockerSandbox:
    """Runs each program in a fresh container of `image` (which must provide `python`)."""

    image: str = "python:3.11-slim"
    timeout_s: float = 10.0
    memory_mb: int = 512
    cpus: float = 1.0
    max_processes: int = 64
    max_output_bytes: int = 65536
    _client: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb <= 0 or self.cpus <= 0:
            raise ValueError("DockerSandbox needs timeout_s > 0, memory_mb > 0 and cpus > 0")
        try:
            import docker
        except ImportError as exc:
            raise SandboxUnavailable(
                "DockerSandbox needs the docker SDK: pip install 'srt-agent[docker]' (or `pip install docker`)"
            ) from exc
        try:
            self._client = docker.from_env()
            self._client.ping()
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(
                f"cannot reach the Docker daemon ({exc}). Start Docker (or set DOCKER_HOST), "
                "or use another sandbox: make_sandbox('local') (bubblewrap) or 'sandbox_fusion'."
            ) from exc
        self._ensure_image()

    def _ensure_image(self) -> None:
        """Pull `image` once if the engine lacks it (`containers.create` does not pull)."""
        import docker

        try:
            self._client.images.get(self.image)
        except docker.errors.ImageNotFound:
            try:
                self._client.images.pull(self.image)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailable(f"Docker image {self.image!r} is missing and cannot be pulled: {exc}") from exc

    def run(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run `code` in a new container; never raises for anything the program does.

        Output is streamed from the container and cut at `max_output_bytes` (the container is then
        killed); a timer kills it at the deadline.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        container = None
        deadline_passed = threading.Event()
        try:
            container = self._client.containers.create(
                self.image,
                command=["sh", "-c", _RUN],
                user="65534:65534",
                working_dir="/tmp",
                network_mode="none",
                mem_limit=f"{self.memory_mb}m",
                memswap_limit=f"{self.memory_mb}m",
                nano_cpus=int(self.cpus * 1e9),
                pids_limit=self.max_processes,
                tmpfs={"/tmp": "size=64m"},
                environment={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HOME": "/tmp"},
            )
            container.put_archive("/", _program_archive(code, stdin))
            stream = container.attach(stdout=True, stderr=True, stream=True, logs=True, demux=True)
            container.start()
            killer = threading.Timer(timeout, _kill_at_deadline, (container, deadline_passed))
            killer.start()
            stdout, stderr, truncated = _read_capped(stream, self.max_output_bytes)
            if truncated:
                _kill_at_deadline(container, None)
            killer.cancel()
            exit_code = int(container.wait(timeout=30)["StatusCode"])
            container.reload()
            oom = bool(container.attrs["State"].get("OOMKilled"))
        except _engine_errors() as exc:
            return SandboxResult(status="sandbox_error", stderr=f"docker: {exc}", wall_s=time.monotonic() - start)
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except _engine_errors():
                    pass
        result = SandboxResult(
            status="ok",
            stdout=stdout.decode("utf-8", errors="replace"),
            stderr=stderr.decode("utf-8", errors="replace"),
            exit_code=exit_code,
            wall_s=time.monotonic() - start,
            truncated=truncated,
        )
        if truncated:
            result.status, result.exit_code = "output_limit", None
        elif deadline_passed.is_set():
            result.status, result.exit_code = "timeout", None
        elif oom or is_memory_error(result.stderr):
            result.status = "memory"
        elif exit_code > 128:
            result.status, result.exit_code = "killed", 128 - exit_code
        elif exit_code:
            result.status = "error"
        return result


def _kill_at_deadline(container: Any, flag: threading.Event | None) -> None:
    """Kill a container (from the deadline timer or past the output cap), ignoring one already gone."""
    if flag is not None:
        flag.set()
    try:
        container.kill()
    except _engine_errors():
        pass


def _engine_errors() -> tuple[type[Exception], ...]:
    """What the docker SDK raises when the engine fails or stalls (its HTTP layer is requests)."""
    import docker
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException)


def _read_capped(stream: Any, cap: int) -> tuple[bytes, bytes, bool]:
    """Read (stdout, stderr) chunks from a demuxed attach stream until it ends or `cap` is passed."""
    out, err, total = bytearray(), bytearray(), 0
    for chunk_out, chunk_err in stream:
        for chunk, sink in ((chunk_out, out), (chunk_err, err)):
            if chunk:
                sink += chunk[: max(cap - total, 0)]
                total += len(chunk)
        if total > cap:
            return bytes(out), bytes(err), True
    return bytes(out), bytes(err), False
