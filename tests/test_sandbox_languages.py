"""C++, JavaScript and bash in the local sandbox and through `srt-agent sandbox serve`, as SandboxFusion runs
them: C++ is compiled by g++ in a sandbox of its own within `compile_timeout`, and a program that does not
compile comes back with `compile_result` alone (verl scores it -4, a compile error)."""

from __future__ import annotations

import httpx
import pytest

from srt_agent.tools import LocalSandbox, SandboxFusionSandbox, languages
from srt_agent.tools.local import bwrap_path
from srt_agent.tools.server import ServerConfig, running_server

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
needs_gpp = pytest.mark.skipif(languages.missing_tools("cpp") is not None, reason="g++ is not installed")
needs_node = pytest.mark.skipif(languages.missing_tools("nodejs") is not None, reason="node is not installed")

DOUBLE = "#include <iostream>\nint main() { long a; std::cin >> a; std::cout << 2 * a << std::endl; }\n"
# Each level instantiates the two below it: the compiler works for ever, the program would be tiny.
SLOW_TO_COMPILE = """
template <int N> struct F { static constexpr long v = F<N - 1>::v + F<N - 2>::v; };
template <> struct F<1> { static constexpr long v = 1; };
template <> struct F<0> { static constexpr long v = 0; };
template <int N, int M> struct G { static constexpr long v = G<N - 1, M>::v + G<N, M - 1>::v; };
template <int N> struct G<N, 0> { static constexpr long v = F<N % 40>::v; };
template <int M> struct G<0, M> { static constexpr long v = M; };
int main() { return G<400, 400>::v == 7; }
"""


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox(timeout_s=10)


@needs_gpp
class TestCpp:
    def test_compiles_then_runs_with_stdin(self, sandbox):
        result = sandbox.run(DOUBLE, stdin="21\n", language="cpp")
        assert (result.status, result.stdout, result.exit_code) == ("ok", "42\n", 0), result
        assert result.compile is not None and result.compile.status == "ok" and result.compile.exit_code == 0

    def test_a_program_that_does_not_compile(self, sandbox):
        result = sandbox.run("a=b\n", language="cpp")
        assert result.status == "compile_error" and "does not name a type" in result.stderr
        assert result.compile.status == "error" and result.compile.exit_code != 0

    def test_the_compiler_has_its_own_time_limit(self, sandbox):
        result = sandbox.run(SLOW_TO_COMPILE, language="cpp", compile_timeout_s=0.5, timeout_s=30)
        assert result.status == "compile_error" and result.compile.status == "timeout"

    def test_run_timeout_and_crashes_are_the_programs(self, sandbox):
        assert sandbox.run("int main() { for (;;) {} }", language="cpp", timeout_s=1).status == "timeout"
        assert sandbox.run("int main() { return 3; }", language="cpp").exit_code == 3
        crash = sandbox.run("int main() { volatile int *p = nullptr; return *p; }", language="cpp")
        assert (crash.status, crash.exit_code) == ("killed", -11)

    def test_the_binary_stays_inside(self, sandbox):
        """The compiled program sees the sandbox's read-only view: no network, no writing outside /tmp."""
        code = (
            '#include <cstdio>\nint main() { FILE *f = std::fopen("/usr/x", "w"); std::puts(f ? "wrote" : "refused"); }'
        )
        assert sandbox.run(code, language="cpp").stdout == "refused\n"


@needs_node
def test_javascript_runs(sandbox):
    result = sandbox.run(
        "const x = require('fs').readFileSync(0, 'utf8'); console.log(x.trim() * 2)", stdin="21", language="nodejs"
    )
    assert (result.status, result.stdout) == ("ok", "42\n"), result


def test_a_language_whose_tools_are_missing_is_named(sandbox, monkeypatch):
    missing = languages.Language("cobol", "main.cob", ("/nonexistent/cobc", languages.PROGRAM))
    monkeypatch.setitem(languages.LANGUAGES, "cobol", missing)
    assert "cobol" not in languages.available()
    with pytest.raises(ValueError, match="cobol needs /nonexistent/cobc, which this machine lacks"):
        sandbox.run("x", language="cobol")
    with pytest.raises(ValueError, match="language 'fortran' is not one of"):
        sandbox.run("x", language="fortran")


@pytest.fixture(scope="module")
def endpoint():
    with running_server(ServerConfig(LocalSandbox(timeout_s=10))) as url:
        yield url


@needs_gpp
class TestServer:
    def post(self, endpoint: str, **body) -> dict:
        response = httpx.post(f"{endpoint}/run_code", json={"language": "cpp", **body}, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    def test_compile_error_has_only_a_compile_result(self, endpoint):
        body = self.post(endpoint, code="a=b")
        assert (body["status"], body["run_result"], body["srt_status"]) == ("Failed", None, "compile_error")
        compiled = body["compile_result"]
        assert compiled["status"] == "Finished" and compiled["return_code"] != 0 and "a" in compiled["stderr"]

    def test_compile_timeout(self, endpoint):
        body = self.post(endpoint, code=SLOW_TO_COMPILE, compile_timeout=0.5)
        assert (body["status"], body["run_result"], body["compile_result"]["status"]) == (
            "Failed",
            None,
            "TimeLimitExceeded",
        )

    def test_success_has_both_results(self, endpoint):
        body = self.post(endpoint, code=DOUBLE, stdin="5")
        assert body["status"] == "Success" and body["run_result"]["stdout"] == "10\n"
        assert (body["compile_result"]["status"], body["compile_result"]["return_code"]) == ("Finished", 0)

    def test_our_client_reads_a_compile_error(self, endpoint):
        result = SandboxFusionSandbox(endpoint).run("a=b", language="cpp")
        assert result.status == "compile_error" and "does not name a type" in result.stderr

    def test_verl_scores_a_compile_error_as_one(self, endpoint):
        utils = pytest.importorskip("verl.utils.reward_score.sandbox_fusion.utils", reason="verl is not installed")
        cases = {"inputs": ["1", "2"], "outputs": ["2\n", "4\n"]}
        results, metadata = utils.check_correctness(f"{endpoint}/run_code", cases, "a=b", language="cpp")
        assert results == [-4, -4] and metadata[0]["status"] == "compile_error"
        results, _ = utils.check_correctness(f"{endpoint}/run_code", cases, DOUBLE, language="cpp")
        assert results == [True, True]


@needs_node
def test_server_runs_javascript(endpoint):
    body = httpx.post(f"{endpoint}/run_code", json={"code": "console.log(6 * 7)", "language": "nodejs"}, timeout=60)
    assert body.json()["run_result"]["stdout"] == "42\n"
