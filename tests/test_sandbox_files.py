"""What a run is given and gives back in the bubblewrap sandbox: files, fetched files, bash, localhost."""

from __future__ import annotations

import pytest

from srt_agent.tools import LocalSandbox
from srt_agent.tools.files import decode_files, sandbox_path, workdir_relative
from srt_agent.tools.local import bwrap_path

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox(timeout_s=10, max_file_mb=1)


class TestNames:
    @pytest.mark.parametrize(
        "name, inside",
        [
            ("a.txt", "/tmp/a.txt"),
            ("d1/d2/f", "/tmp/d1/d2/f"),
            ("./x//y", "/tmp/x/y"),
            ("/tmp/x", "/tmp/x"),
            ("/mnt/b", "/tmp/.mnt/b"),
        ],
    )
    def test_names_land_in_the_working_directory(self, name, inside):
        assert sandbox_path(name) == inside

    @pytest.mark.parametrize(
        "name, reason",
        [
            ("../x", "leaves"),
            ("a/../../x", "leaves"),
            ("..", "leaves"),
            (".", "leaves"),
            ("/etc/passwd", "outside"),
            ("/tmp/../etc/passwd", "outside"),
            ("/tmp", "outside"),
            ("/mntx/a", "outside"),
            ("", "not a usable path"),
            ("a\0b", "not a usable path"),
        ],
    )
    def test_names_outside_are_refused_saying_why(self, name, reason):
        with pytest.raises(ValueError, match=reason):
            workdir_relative(name)

    def test_null_entries_and_skip_marks_are_left_out(self):
        files = {"a": "aGk=", "b": None, "x/IGNORE_THIS_FILE": "aGk="}
        assert decode_files(files) == {"a": b"hi"}

    def test_bad_base64_is_refused(self):
        with pytest.raises(ValueError, match="not base64"):
            decode_files({"a": "a"})


@needs_bwrap
class TestFiles:
    def test_files_are_in_the_working_directory_and_writable(self, sandbox):
        code = "print(open('d1/d2/flag').read())\nopen('d1/d2/flag', 'a').write('!')\nprint(open('/tmp/d1/d2/flag').read())"
        result = sandbox.run(code, files={"d1/d2/flag": b"secret"})
        assert (result.status, result.stdout) == ("ok", "secret\nsecret!\n"), result

    def test_binary_content_round_trips(self, sandbox):
        data = bytes(range(256)) * 4
        result = sandbox.run(
            "open('copy', 'wb').write(open('data', 'rb').read())", files={"data": data}, fetch_files=["copy"]
        )
        assert result.files == {"copy": data}, result

    def test_fetch_files_come_back_missing_ones_left_out(self, sandbox):
        code = "import os\nopen('a.txt', 'w').write('secret')\nopen('/mnt/b', 'w').write('sauce')\nos.mkdir('folder')"
        result = sandbox.run(code, fetch_files=["a.txt", "/mnt/b", "never_written", "folder"])
        assert result.files == {"a.txt": b"secret", "/mnt/b": b"sauce"}, result

    def test_fetching_a_fifo_or_a_device_skips_it(self, sandbox):
        code = "import os\nos.mkfifo('pipe')\nos.symlink('/dev/zero', 'zeros')\nopen('ok', 'w').write('ok')"
        result = sandbox.run(code, fetch_files=["pipe", "zeros", "ok"])
        assert (result.status, result.files) == ("ok", {"ok": b"ok"}), result

    def test_fetch_keeps_the_programs_exit_code(self, sandbox):
        result = sandbox.run("open('out', 'w').write('partial')\nraise SystemExit(3)", fetch_files=["out"])
        assert (result.status, result.exit_code, result.files) == ("error", 3, {"out": b"partial"})
        killed = sandbox.run(
            "import os, signal\nopen('out', 'w').write('x')\nos.kill(os.getpid(), signal.SIGSEGV)", fetch_files=["out"]
        )
        assert (killed.status, killed.exit_code, killed.files) == ("killed", -11, {"out": b"x"})

    def test_fetched_files_are_capped_together(self, sandbox):
        code = "open('a', 'wb').write(b'a' * 600_000)\nopen('b', 'wb').write(b'b' * 600_000)"
        result = sandbox.run(code, fetch_files=["a", "b"])  # max_file_mb=1: both do not fit
        assert list(result.files) == ["a"] and len(result.files["a"]) == 600_000

    def test_a_timed_out_run_fetches_nothing(self, sandbox):
        result = sandbox.run("open('a', 'w').write('x')\nimport time\ntime.sleep(30)", fetch_files=["a"], timeout_s=1)
        assert (result.status, result.files) == ("timeout", {})

    def test_hostile_programs_that_fetch_stay_contained(self, sandbox):
        """With fetch_files the program runs under a collector; killing it or flooding only hurts the run."""
        kill = sandbox.run("import os\nopen('a', 'w').write('x')\nos.kill(os.getppid(), 9)", fetch_files=["a"])
        bomb = sandbox.run(
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            fetch_files=["a"],
            timeout_s=2,
        )
        flood = sandbox.run("while True:\n    print('spam')", fetch_files=["a"])
        assert (kill.status, kill.exit_code, kill.files) == ("killed", -9, {}), kill
        assert (bomb.status, bomb.files) == ("timeout", {}) and (flood.status, flood.files) == ("output_limit", {})
        assert sandbox.run("print('next')").stdout == "next\n"

    def test_files_are_private_to_their_run(self, sandbox):
        sandbox.run("print(1)", files={"mine": b"x"})
        assert sandbox.run("import os\nprint(os.listdir('.'))").stdout == "[]\n"

    def test_files_over_the_working_directory_are_refused(self):
        small = LocalSandbox(timeout_s=5, tmp_mb=1)
        with pytest.raises(ValueError, match="working directory"):
            small.run("print(1)", files={"big": b"x" * (2 << 20)})

    @pytest.mark.parametrize("field", ["files", "fetch_files"])
    def test_bad_names_are_refused_before_running(self, sandbox, field):
        value = {"../escape": b"x"} if field == "files" else ["../escape"]
        with pytest.raises(ValueError, match="leaves the run's working directory"):
            sandbox.run("print(1)", **{field: value})


@needs_bwrap
class TestLanguagesAndNames:
    def test_bash_runs_with_the_sandboxes_python_on_path(self, sandbox):
        code = 'read line\necho "got $line"\ncat given\npython -c "import sys; print(sys.executable)"\nexit 4'
        result = sandbox.run(code, language="bash", stdin="hi\n", files={"given": b"file\n"})
        expected = f"got hi\nfile\n{sandbox.interpreter_inside}\n"
        assert (result.status, result.exit_code, result.stdout) == ("error", 4, expected), result

    def test_unknown_language_is_refused(self, sandbox):
        with pytest.raises(ValueError, match="language 'fortran'"):
            sandbox.run("program p\nend program p", language="fortran")

    def test_localhost_is_the_sandboxes_own_loopback(self, sandbox):
        """A server on the sandbox's loopback is reached by name; the network stays off."""
        code = (
            "import socket, threading\n"
            "server = socket.create_server(('127.0.0.1', 0))\n"
            "threading.Thread(target=lambda: server.accept()[0].sendall(b'hello'), daemon=True).start()\n"
            "with socket.create_connection(('localhost', server.getsockname()[1]), timeout=5) as conn:\n"
            "    print(conn.recv(5).decode())\n"
            "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=1)\nexcept OSError as exc:\n    print(exc.errno)\n"
        )
        result = sandbox.run(code)
        assert result.stdout.split() == ["hello", "101"], result  # ENETUNREACH
