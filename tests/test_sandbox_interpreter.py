"""CodeInterpreter (what the model gets back), make_sandbox and the verl tool configs in tools/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, strategies as st

from srt_agent.tools import (
    SANDBOX_STATUSES,
    CodeInterpreter,
    LocalSandbox,
    SandboxFusionSandbox,
    SandboxResult,
    make_sandbox,
    truncate_middle,
)
from srt_agent.tools.interpreter import format_result
from srt_agent.tools.local import bwrap_path

TOOLS_DIR = Path(__file__).resolve().parents[1] / "tools"
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture(scope="module")
def interpreter() -> CodeInterpreter:
    return CodeInterpreter(LocalSandbox(timeout_s=2), max_output_chars=300)


@needs_bwrap
class TestCodeInterpreter:
    def test_stdout_only(self, interpreter):
        text, result = interpreter.execute("print(sum(range(101)))")
        assert text == "5050" and result.status == "ok"

    def test_error_shows_the_traceback(self, interpreter):
        text, result = interpreter.execute("import math\nprint('x')\nmath.sqrt(-1)")
        assert result.status == "error"
        assert text.startswith("x\nTraceback") and text.endswith("ValueError: math domain error")

    def test_timeout_keeps_partial_output_and_says_so(self, interpreter):
        text, result = interpreter.execute("print('started')\nwhile True:\n    pass")
        assert result.status == "timeout" and text == "started\nExecution timed out."

    def test_long_output_is_cut_in_the_middle(self, interpreter):
        text, result = interpreter.execute("for i in range(1000):\n    print(i)")
        assert result.status == "ok" and len(text) <= 300
        assert text.startswith("0\n1\n2\n") and text.endswith("998\n999") and "characters truncated" in text

    def test_output_cap_is_reported(self):
        small = CodeInterpreter(LocalSandbox(timeout_s=2, max_output_bytes=1000), max_output_chars=100)
        text, result = small.execute("while True:\n    print('spam')")
        assert result.status == "output_limit" and text.endswith("Output limit exceeded; the program was stopped.")

    def test_silent_program(self, interpreter):
        assert interpreter.execute("x = 1")[0] == "(no output)"


class TestFormatting:
    def test_silent_failure_gives_the_exit_code(self):
        assert format_result(SandboxResult(status="error", exit_code=3), 100) == "Exited with code 3."

    def test_sandbox_error_is_named(self):
        text = format_result(SandboxResult(status="sandbox_error", stderr="server down"), 100)
        assert text == "server down\nThe sandbox failed to run the code."

    @pytest.mark.parametrize("size", [0, 5, 99, 100, 101, 1000])
    def test_truncate_middle_bounds(self, size):
        text = "".join(chr(97 + i % 26) for i in range(size))
        cut = truncate_middle(text, 100)
        assert len(cut) <= 100 and (cut == text) == (size <= 100)
        if size > 100:
            assert cut.startswith(text[:10]) and cut.endswith(text[-10:])
            head, tail = cut.split("\n...[")[0], cut.split("]...\n")[1]
            assert f"[{size - len(head) - len(tail)} characters truncated]" in cut

    @given(
        stdout=st.text(max_size=400),
        stderr=st.text(max_size=400),
        status=st.sampled_from(SANDBOX_STATUSES),
        max_chars=st.integers(1, 300),
    )
    def test_text_fits_and_keeps_the_status_note(self, stdout, stderr, status, max_chars):
        text = format_result(SandboxResult(status=status, stdout=stdout, stderr=stderr, exit_code=1), max_chars)
        assert len(text) <= max_chars
        if status in ("timeout", "memory", "output_limit") and max_chars >= 100:
            assert text.endswith(".")  # the note survives the cut

    def test_bad_max_chars(self):
        with pytest.raises(ValueError):
            CodeInterpreter(SandboxFusionSandbox("http://127.0.0.1:9"), max_output_chars=0)


class TestFactoryAndConfigs:
    def test_unknown_kind(self):
        with pytest.raises(ValueError, match="unknown sandbox kind 'firecracker'"):
            make_sandbox("firecracker")

    def test_bad_option_names_the_sandbox(self):
        with pytest.raises(ValueError, match="bad options for the 'sandbox_fusion' sandbox"):
            make_sandbox("sandbox-fusion", tiemout_s=3)

    def test_kinds(self):
        assert isinstance(make_sandbox("sandbox_fusion", endpoint="http://h:1"), SandboxFusionSandbox)
        if bwrap_path():
            assert make_sandbox("local", timeout_s=3).timeout_s == 3

    @pytest.mark.parametrize("name", ["code_interpreter.yaml", "code_interpreter_sandbox_fusion.yaml"])
    def test_tool_configs_follow_verls_format_and_build(self, name):
        config = yaml.safe_load((TOOLS_DIR / name).read_text())
        (tool,) = config["tools"]
        assert tool["class_name"].count(".") >= 2 and tool["config"]["type"] == "native"
        function = tool["tool_schema"]["function"]
        assert tool["tool_schema"]["type"] == "function" and function["name"] == "code_interpreter"
        assert function["parameters"]["required"] == ["code"]
        assert function["parameters"]["properties"]["code"]["type"] == "string"
        if tool["config"]["sandbox"] == "local" and not bwrap_path():
            pytest.skip("bubblewrap is not installed")
        built = CodeInterpreter.from_config(tool["config"])
        assert built.max_output_chars == tool["config"]["max_output_chars"]
        assert built.sandbox.timeout_s == tool["config"]["timeout_s"]
