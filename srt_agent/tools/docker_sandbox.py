"""Docker as the code sandbox: a throwaway container per run, no network, memory/CPU/pids limits.

Needs the `docker` Python package (`pip install 'srt-agent[docker]'`), a reachable Docker engine and the
sandbox image, which `scripts/install_docker.sh` builds without a registry (Debian bookworm, python3 and the
local sandbox's runtime libraries, no folder the program's uid may write to); construction fails with
SandboxUnavailable otherwise.

A run is one container of that image: a launcher as its first process (pid 1, so the program cannot kill
it, and it reaps orphans) waits for the word to go on its stdin, then copies the given files into the
working directory `/tmp` (a size-capped tmpfs), runs the program as its child as user `nobody` and exits as
the program did; files to fetch come back after the program's output, from the local sandbox's collector
(the engine cannot read a tmpfs). Containers are started ahead of their runs in a warm pool (docker_pool.py;
`pool_size`), each used by one run only and removed after it, whatever ended it. Output comes over the
container's raw attach socket, read without blocking: past `max_output_bytes` or at the deadline the
container is killed and the socket closed at once (an engine whose output nobody reads holds the
container's exit back). As the local sandbox's, the deadline counts from the program's start (the word to
go), cut short by the server's `deadline`; the server's `watch` is told the container's first process,
so its scheduler sees, lowers and kills the container's processes as it does the local sandbox's.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import secrets
import selectors
import socket
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import SandboxResult, SandboxUnavailable
from .docker_pool import Warm, WarmPool, remove_container
from .files import COLLECTOR, MAX_FILES, WORKDIR, check_names, sandbox_path, workdir_relative
from .languages import PROGRAM_ENV
from .process import ProcessOutcome, classify

DEFAULT_IMAGE = "srt-agent-sandbox:bookworm"
LABEL = "srt-agent.sandbox"  # on every container a run creates (tests look for leftovers by it)
_PROGRAMS = {"python": ("main.py", "/usr/bin/python"), "bash": ("main.sh", "/bin/bash")}
_NOBODY = "65534:65534"
_CHUNK = 65536
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", **PROGRAM_ENV}  # the local sandbox's, but for the interpreter's folder

# The container's first process. Signals sent from inside the container never reach it, so a program that
# kills its parent or every process it can (kill -1) leaves it standing, as bubblewrap's init does.
_LAUNCHER = """\
import json, os, resource, shutil
if os.read(0, 1) != b"g":  # the run's word to go: its program and files are in place
    os._exit(125)
spec = json.load(open("/sandbox/run.json"))
argv, fetch = spec["argv"], spec.get("fetch")
for folder, _, names in os.walk("/sandbox/files"):
    inside = "/tmp" + folder[len("/sandbox/files"):]
    os.makedirs(inside, exist_ok=True)
    for name in names:
        shutil.copyfile(os.path.join(folder, name), os.path.join(inside, name))
if fetch:  # the program runs under the collector, which writes the files it leaves to a pipe read here
    read, write = os.pipe()
    os.set_inheritable(write, True)
    names = json.dumps(fetch["names"])
    argv = ["/usr/bin/python3", "-I", "-S", "-c", fetch["collector"], str(write), str(fetch["limit"]), names, *argv]
pid = os.fork()
if pid == 0:
    try:
        os.dup2(os.open("/sandbox/stdin", os.O_RDONLY), 0)
        resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1))
        os.execv(argv[0], argv)
    finally:
        os._exit(127)
if fetch:
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 20):
        chunks.append(chunk)
while (found := os.wait())[0] != pid:
    pass
code = os.waitstatus_to_exitcode(found[1])
if fetch:  # after the program's output: the files, the run's mark and their length, read back from the end
    data = b"".join(chunks)
    tail = memoryview(data + fetch["mark"].encode() + b"%016x" % len(data))
    while tail:
        tail = tail[os.write(1, tail):]
os._exit(code if code >= 0 else 128 - code)
"""


def _program_archive(
    code: str, stdin: str, language: str, files: Mapping[str, bytes], fetch: dict | None, cpu_s: int = 11
) -> bytes:
    """A tar of /sandbox (the program, its stdin, the launcher's run.json with the program's CPU-time limit,
    the given files under files/), owned by root and read-only to the program, for `put_archive` at `/`."""
    name, runner = _PROGRAMS[language]
    spec = {"argv": [runner, f"/sandbox/{name}"], "fetch": fetch, "cpu_s": cpu_s}
    entries = {
        f"sandbox/{name}": code.encode(),
        "sandbox/stdin": stdin.encode(),
        "sandbox/run.json": json.dumps(spec).encode(),
    }
    entries.update({f"sandbox/files/{workdir_relative(path)}": data for path, data in files.items()})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folders = {path.rsplit("/", i)[0] for path in entries for i in range(1, path.count("/") + 1)}
        for folder in sorted(folders):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o444
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _take_fetched(out: bytearray, mark: bytes) -> dict[str, bytes]:
    """Cut the launcher's trailer (the fetched files as JSON, the run's mark, 16 hex digits of the JSON's
    length) off the end of stdout; no files when it is not there (the program did not end by itself)."""
    end = len(out) - 16 - len(mark)
    if end < 0 or out[end : end + len(mark)] != mark:
        return {}
    try:
        size = int(out[-16:], 16)
    except ValueError:
        return {}
    data = bytes(out[max(end - size, 0) : end])
    del out[max(end - size, 0) :]
    try:
        found = json.loads(data)
        return {str(name): base64.b64decode(content) for name, content in found.items()}
    except (ValueError, TypeError, AttributeError, binascii.Error):
        return {}


class _Demux:
    """Docker's multiplexed attach stream (8-byte frame headers: stream, 0, 0, 0, size), read as it comes,
    keeping at most `cap` bytes of stdout and stderr together."""

    def __init__(self, cap: int):
        self.cap, self.total = cap, 0
        self.out, self.err, self._header = bytearray(), bytearray(), bytearray()
        self._stream, self._left = 1, 0

    def feed(self, data: bytes) -> bool:
        """Take the next bytes of the stream; True once the output passed the cap."""
        view = memoryview(data)
        while view:
            if not self._left:
                take = 8 - len(self._header)
                self._header += view[:take]
                view = view[take:]
                if len(self._header) == 8:
                    self._stream, self._left = self._header[0], int.from_bytes(self._header[4:], "big")
                    self._header.clear()
                continue
            piece, view = view[: self._left], view[self._left :]
            self._left -= len(piece)
            (self.err if self._stream == 2 else self.out).extend(piece[: max(self.cap - self.total, 0)])
            self.total += len(piece)
            if self.total > self.cap:
                return True
        return False


def _read_until(sock: Any, demux: _Demux, deadline: float) -> str:
    """Read the attach socket until it ends ("ended"), the output passes the cap ("output_limit") or the
    deadline passes ("timeout")."""
    sock.setblocking(False)
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        while (remaining := deadline - time.monotonic()) > 0:
            if not selector.select(remaining):
                continue
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                return "ended"
            if demux.feed(data):
                return "output_limit"
    return "timeout"


@dataclass
class DockerSandbox:
    """Runs each program in a fresh container of `image` (default: the image scripts/install_docker.sh
    builds). Limits as the local sandbox's: `memory_mb` (RAM, plus the `tmp_mb` working directory, both
    counted in the container's memory cgroup), `max_processes`, `max_file_mb` (largest file written),
    `max_output_bytes` (stdout and stderr together), and `cpus` (CPU share). `pool_size` containers per set of
    limits wait, started, for their runs (0: each run starts its own). `client` (default: `docker.from_env()`)
    and the pool are shared by copies made with `dataclasses.replace`; `close` removes the waiting ones."""

    image: str = DEFAULT_IMAGE
    timeout_s: float = 10.0
    memory_mb: int = 512
    cpus: float = 1.0
    max_processes: int = 64
    max_output_bytes: int = 65536
    tmp_mb: int = 64
    max_file_mb: int = 16
    pool_size: int = 4
    client: Any = field(default=None, repr=False, compare=False)
    pool: WarmPool | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "cpus", "max_processes", "max_output_bytes", "tmp_mb", "max_file_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DockerSandbox needs {name} > 0, got {getattr(self, name)!r}")
        try:
            import docker
        except ImportError as exc:
            raise SandboxUnavailable(
                "DockerSandbox needs the docker SDK: pip install 'srt-agent[docker]' (or `pip install docker`)"
            ) from exc
        if self.client is None:
            try:
                self.client = docker.from_env()
                self.client.ping()
            except docker.errors.DockerException as exc:
                raise SandboxUnavailable(
                    f"cannot reach the Docker daemon ({exc}). Start Docker (as root: bash scripts/install_docker.sh; "
                    "or set DOCKER_HOST), or use another sandbox: make_sandbox('local') (bubblewrap) or 'sandbox_fusion'."
                ) from exc
        self._ensure_image()
        if self.pool is None and self.pool_size > 0:
            self.pool = WarmPool(self.pool_size, hang_up=lambda warm: _hang_up(warm.sock, warm.raw))
            self.pool.want(*self._pool_entry())

    def close(self) -> None:
        """Remove the containers waiting in the pool (and those left to remove)."""
        if self.pool is not None:
            self.pool.close()

    @property
    def sandboxed(self) -> bool:
        return True

    def languages(self) -> list[str]:
        return list(_PROGRAMS)

    def origin(self) -> dict[str, str]:
        return {"image": self.image}

    def _ensure_image(self) -> None:
        """Pull `image` once if the engine lacks it (`containers.create` does not pull); the default image
        is built here, never pulled."""
        import docker

        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            if self.image == DEFAULT_IMAGE:
                raise SandboxUnavailable(
                    f"the Docker sandbox's image {self.image!r} is not built: bash scripts/install_docker.sh"
                ) from None
            try:
                self.client.images.pull(self.image)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailable(f"Docker image {self.image!r} is missing and cannot be pulled: {exc}") from exc

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float | None = None,
        files: Mapping[str, bytes] | None = None,
        fetch_files: Sequence[str] = (),
        language: str = "python",
        deadline: float | None = None,
        watch: Callable[[int], None] | None = None,
        interactive: bool = False,
    ) -> SandboxResult:
        """Run `code` (Python, or `language="bash"`) in a container of its own; never raises for anything the
        program does. `files` (name -> content) are put in the working directory first; `fetch_files` come
        back in the result's `files` when the program ends by itself (names as the local sandbox takes them,
        at most `max_file_mb` in all). `deadline` (a `time.monotonic()` instant) cuts the run short; `watch(pid)`
        is told the container's first process before the program starts; `interactive` runs may take the
        pool's last waiting container. Bad names, an unknown language or a nonpositive timeout raise ValueError."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout!r}")
        if language not in _PROGRAMS:
            raise ValueError(f"language {language!r} is not one of {tuple(_PROGRAMS)}")
        files, fetch_files = dict(files or {}), check_names(fetch_files)
        check_names(files)
        if sum(map(len, files.values())) > self.tmp_mb << 20:
            raise ValueError(f"the files given to a run take over its {self.tmp_mb} MB working directory")
        start = time.monotonic()
        fetch = None
        if fetch_files:
            names = [[name, sandbox_path(name)] for name in fetch_files]
            fetch = {
                "collector": COLLECTOR,
                "limit": self.max_file_mb << 20,
                "names": names,
                "mark": secrets.token_hex(16),
            }
        archive = _program_archive(code, stdin, language, files, fetch, math.ceil(timeout) + 1)
        warm = None
        try:
            key, launch = self._pool_entry()
            warm = self.pool.take(key, launch, interactive) if self.pool is not None else None
            warm = warm or launch()
            warm.container.put_archive("/", archive)
            if watch is not None and warm.pid:
                watch(warm.pid)
            cut = timeout if deadline is None else min(timeout, deadline - time.monotonic())
            if cut <= 0:
                return SandboxResult(status="timeout", stderr="no time was left to run it")
            outcome, oom, fetched = self._go_and_wait(warm, start, cut, fetch)
        except _engine_errors() as exc:
            return SandboxResult(status="sandbox_error", stderr=f"docker: {exc}", wall_s=time.monotonic() - start)
        finally:
            if warm is not None:
                _hang_up(warm.sock, warm.raw)
                self.pool.discard(warm.container) if self.pool is not None else remove_container(warm.container)
        result = classify(outcome, signal_offset=128)
        result.wall_s, result.files = time.monotonic() - start, fetched
        if oom and result.status in ("error", "killed"):
            result.status = "memory"
        return result

    def _pool_entry(self) -> tuple[str, Callable[[], Warm]]:
        """The pool's key for runs under these limits (the image and the create options: every run with the
        same memory shares one), and how to start a container for them."""
        options = self._create_options()
        key = json.dumps([self.image, options], sort_keys=True, default=repr)
        return key, lambda: self._launch(options)

    def _launch(self, options: dict[str, Any]) -> Warm:
        """Create and start a container whose launcher waits for the word to go, attached before it starts."""
        container = self.client.containers.create(self.image, **options)
        try:
            sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            raw = getattr(sock, "_sock", sock)  # the connection under the SDK's reader: nothing is buffered yet
            try:
                container.start()
                container.reload()
            except BaseException:
                _hang_up(sock, raw)
                raise
        except BaseException:
            remove_container(container)
            raise
        return Warm(container, sock, raw, int(container.attrs["State"].get("Pid") or 0))

    def _create_options(self) -> dict[str, Any]:
        """`containers.create`'s arguments: the launcher as user nobody, no network, no capabilities, the
        limits (the launcher sets the program's CPU-time limit, from its run), and its stdin open for the word
        to go."""
        from docker.types import Ulimit

        file_bytes = self.max_file_mb << 20
        return {
            "command": ["/usr/bin/python3", "-I", "-S", "-c", _LAUNCHER],
            "stdin_open": True,
            "user": _NOBODY,
            "working_dir": WORKDIR,
            "environment": _ENV,
            "labels": {LABEL: "1"},
            "network_mode": "none",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": f"{self.memory_mb + self.tmp_mb}m",
            "memswap_limit": f"{self.memory_mb + self.tmp_mb}m",
            "nano_cpus": int(self.cpus * 1e9),
            "pids_limit": self.max_processes,
            "ulimits": [Ulimit(name="fsize", soft=file_bytes, hard=file_bytes),
                        Ulimit(name="core", soft=0, hard=0)],
            "tmpfs": {WORKDIR: f"size={self.tmp_mb}m,mode=1777,exec"},
            "log_config": {"type": "none"},  # output reaches the caller only, never the engine's disk
        }  # fmt: skip

    def _go_and_wait(
        self, warm: Warm, start: float, timeout: float, fetch: dict | None
    ) -> tuple[ProcessOutcome, bool, dict[str, bytes]]:
        """Tell the launcher to go and read the output until it exits, passes the cap or meets the deadline,
        `timeout` after the go (then it is killed); returns the outcome, whether the kernel killed it for
        memory, and the files fetched. With files to fetch, the stream may run past the cap by the files'
        room: they come last."""
        import requests

        container, raw = warm.container, warm.raw
        cap = self.max_output_bytes
        room = 0 if fetch is None else fetch["limit"] * 4 // 3 + (MAX_FILES << 12) + 1024
        demux = _Demux(cap + room)
        try:
            raw.sendall(b"g")
            deadline = time.monotonic() + timeout
            ended = _read_until(raw, demux, deadline)
        finally:
            _hang_up(warm.sock, raw)
        if ended == "ended":  # output closed: the program ended, or closed its output and runs on
            try:
                container.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except requests.exceptions.RequestException:
                if time.monotonic() < deadline:
                    raise
                container.reload()  # a busy engine may answer late for a program that ended in time
                ended = "timeout" if container.attrs["State"].get("Running") else ended
        if ended != "ended":
            _kill(container)
        container.reload()
        state = container.attrs["State"]
        fetched = _take_fetched(demux.out, fetch["mark"].encode()) if fetch and ended == "ended" else {}
        if len(demux.out) + len(demux.err) > cap:  # only where files were to come after the output
            ended, fetched = "output_limit", {}
            del demux.out[cap:], demux.err[cap - len(demux.out) :]
        outcome = ProcessOutcome(
            returncode=int(state.get("ExitCode", 0)),
            stdout=bytes(demux.out),
            stderr=bytes(demux.err),
            wall_s=time.monotonic() - start,
            timed_out=ended == "timeout",
            output_limited=ended == "output_limit",
        )
        return outcome, bool(state.get("OOMKilled")), fetched


def _hang_up(sock: Any, raw: Any) -> None:
    """End the attach connection now (the SDK's reader holds the socket open past a plain close)."""
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    raw.close()


def _kill(container: Any) -> None:
    """Kill a container, ignoring one that already exited."""
    import docker

    try:
        container.kill()
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: not running
            raise


def _engine_errors() -> tuple[type[Exception], ...]:
    """What the docker SDK raises when the engine fails or stalls (its HTTP layer is requests)."""
    import docker
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)
