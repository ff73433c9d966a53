"""`srt-agent sandbox serve` under more work than it can run: every request is answered within its compile and
run timeouts of its arrival (queue included), a program stopped by load is ``overloaded`` (SandboxFusion's
SandboxError, which verl scores -1, never TimeLimitExceeded, which it scores -3), an interactive program
sent during a flood starts in a slot of its own, callers share the slots fairly, 500 calls at once are all
answered, a client that leaves takes its program with it, and the agent loop treats an overloaded sandbox as
a fault, never as the model's failure. Real HTTP, the real bubblewrap sandbox, real programs; no timing
asserts (answers arriving before the client's timeout is the contract, as verl's client sees it)."""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from srt_agent.agent import EnvConfig, MultiTurnController, ReToolEnv, load_tools
from srt_agent.bench.sandbox_load import run_load
from srt_agent.engine import AsyncEngine, Engine, EngineOptions
from srt_agent.models import load_model
from srt_agent.rl.metrics import token_metrics
from srt_agent.sources.arithmetic import arithmetic_tasks
from srt_agent.tools import CodeInterpreter, LocalSandbox, SandboxFusionSandbox, SandboxResult
from srt_agent.tools.local import bwrap_path
from srt_agent.tools.scheduler import RunLoad, RunScheduler, default_fresh_slots, default_max_running, starved
from srt_agent.tools.server import ServerConfig, running_server

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
ROOT = Path(__file__).resolve().parents[1]
SLEEP = "import time\ntime.sleep(60)\n"


def post(
    url: str, code: str, run_timeout: float, compile_timeout: float, margin: float = 5.0, caller: str = "", **extra
) -> dict:
    """One request with the client timeout verl's client would use (compile + run + a margin)."""
    body = {"code": code, "language": "python", "run_timeout": run_timeout, "compile_timeout": compile_timeout}
    headers = {"x-srt-caller": caller} if caller else {}
    response = httpx.post(
        f"{url}/run_code", json={**body, **extra}, headers=headers, timeout=compile_timeout + run_timeout + margin
    )
    assert response.status_code == 200, response.text
    return response.json()


def wait_for(condition, limit_s: float = 30.0) -> None:
    """Poll until `condition()` holds (a hang guard, not a measurement)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.1)


class TestJudgement:
    """When a timeout is the program's own and when load caused it (pure figures)."""

    def test_cut_short_by_the_queue(self):
        assert starved(RunLoad(queued_s=8, allowed_s=2, cpu_s=2, cpu_wait_s=0, processes=3), limit_s=10, cores=2)

    def test_starved_of_the_cpu(self):
        assert starved(RunLoad(allowed_s=10, cpu_s=0.3, cpu_wait_s=9, processes=3), limit_s=10, cores=2)

    def test_its_own_loop_sleep_or_fork_bomb(self):
        assert not starved(RunLoad(allowed_s=10, cpu_s=9.8, cpu_wait_s=0.1, processes=3), limit_s=10, cores=2)
        slept = RunLoad(allowed_s=3, cpu_s=0.0, cpu_wait_s=0.5, processes=3)  # waited to start, then slept
        assert not starved(slept, limit_s=3, cores=2)
        assert not starved(RunLoad(allowed_s=10, cpu_s=None, cpu_wait_s=None), limit_s=10, cores=2)
        bomb = RunLoad(allowed_s=3, cpu_s=0.9, cpu_wait_s=2.7, processes=64)  # it waits for its own processes
        assert not starved(bomb, limit_s=3, cores=2)

    def test_defaults_follow_cores_and_memory(self):
        assert default_max_running(cores=2, memory_mb=24 << 10) == 128
        assert default_max_running(cores=64, memory_mb=8 << 10) == 64  # memory bounds it
        assert default_fresh_slots(cores=2) == 4
        with pytest.raises(ValueError, match="max_running and fresh_slots must be >= 1, interactive_slots >= 0"):
            RunScheduler(max_running=1, fresh_slots=1, quantum_s=0)


def one_slot(**options) -> ServerConfig:
    """A server that runs one program at a time (no interactive slots unless asked)."""
    return ServerConfig(LocalSandbox(timeout_s=10), workers=1, fresh_slots=1, **{"interactive_slots": 0, **options})


def hold_the_slot(url: str, held: dict, run_timeout: float = 6) -> threading.Thread:
    """A sleeping program in the server's one slot (its answer lands in `held`), running when this returns."""
    thread = threading.Thread(target=lambda: held.update(post(url, SLEEP, run_timeout, compile_timeout=0)))
    thread.start()
    wait_for(lambda: httpx.get(f"{url}/v1/load").json()["running"] == 1)
    return thread


def test_a_request_queued_past_its_deadline_is_answered_overloaded():
    """One slot, held by a sleeping program: the next request is answered when its own time is up, as
    SandboxFusion's SandboxError saying the server was overloaded, with the time it waited."""
    with running_server(one_slot()) as url:
        held = {}
        thread = hold_the_slot(url, held)
        body = post(url, "print(1)", run_timeout=1, compile_timeout=0.5)
        thread.join()
    assert (body["status"], body["run_result"]["status"], body["srt_status"]) == ("SandboxError", "Error", "overloaded")
    assert body["srt_queued_s"] > 0 and "overloaded" in body["message"] and "never started" in body["message"]
    assert (held["run_result"]["status"], held["srt_status"]) == ("TimeLimitExceeded", "timeout")  # its own sleep


def test_verl_scores_overload_as_a_sandbox_error_and_its_own_limit_as_a_timeout():
    """verl's own check_correctness: -1 (API or sandbox error) for a call the busy server never ran, -3
    (timeout) for a program that ran out of its own time (a sleep: a loop on a machine others keep busy may
    rightly be judged starved)."""
    utils = pytest.importorskip("verl.utils.reward_score.sandbox_fusion.utils", reason="verl is not installed")
    cases = {"inputs": [""], "outputs": ["1\n"]}
    with running_server(one_slot()) as url:
        held = {}
        thread = hold_the_slot(url, held, run_timeout=8)
        results, metadata = utils.check_correctness(f"{url}/run_code", cases, "print(1)", timeout=1)
        thread.join()
        assert results == [-1] and "overloaded" in str(metadata[0]), metadata
        results, metadata = utils.check_correctness(f"{url}/run_code", cases, SLEEP, timeout=1)
        assert results == [-3] and metadata[0]["status"] == "timeout", metadata
        assert utils.check_correctness(f"{url}/run_code", cases, "print(1)", timeout=1)[0] == [True]


def test_an_interactive_call_starts_in_its_own_slot():
    """The only slot held and a request queued behind it: a short call (run timeout <= 5 s) and one marked
    interactive both run at once, ahead of the queue."""
    with running_server(one_slot(interactive_slots=1)) as url:
        held, queued = {}, {}
        thread = hold_the_slot(url, held, run_timeout=8)
        waiting = threading.Thread(target=lambda: queued.update(post(url, "print(2)", 6, compile_timeout=1)))
        waiting.start()
        wait_for(lambda: httpx.get(f"{url}/v1/load").json()["queued"] == 1)
        short = post(url, "print(1)", run_timeout=5, compile_timeout=0)
        marked = post(url, "print(1)", run_timeout=8, compile_timeout=0, srt_interactive=True)
        load = httpx.get(f"{url}/v1/load").json()
        waiting.join()
        thread.join()
    assert (short["status"], short["run_result"]["stdout"]) == ("Success", "1\n")
    assert (marked["status"], marked["run_result"]["stdout"]) == ("Success", "1\n")
    assert load["queued"] == 1 and load["interactive"] == 2 and load["sandbox"] == "LocalSandbox"
    assert queued["status"] == "SandboxError" and queued["srt_status"] == "overloaded"


def test_callers_share_the_slots_fairly():
    """Caller a queues four programs behind its own running one, then caller b one: b's starts next."""
    with running_server(one_slot()) as url:
        answers: dict[str, dict] = {}

        def send(name: str, caller: str, sleep_s: float = 0.3) -> threading.Thread:
            code = f"import time\ntime.sleep({sleep_s})\nprint({name!r})"
            call = lambda: answers.update({name: post(url, code, 8, 8, caller=caller)})  # noqa: E731
            thread = threading.Thread(target=call)
            thread.start()
            return thread

        threads = [send("a0", "a", sleep_s=4)]
        wait_for(lambda: httpx.get(f"{url}/v1/load").json()["running"] == 1)
        threads += [send(f"a{i}", "a") for i in range(1, 5)]
        wait_for(lambda: httpx.get(f"{url}/v1/load").json()["queued"] == 4)
        threads.append(send("b0", "b"))
        for thread in threads:
            thread.join()
    assert all(answer["status"] == "Success" for answer in answers.values()), answers
    waited = sorted(answers, key=lambda name: answers[name]["srt_queued_s"])
    assert waited[:2] == ["a0", "b0"], waited


def test_five_hundred_calls_at_once_are_all_answered_and_the_server_serves_on():
    """A run's scale: 500 endless loops at once (128 may run, the rest wait) are each answered as a timeout or
    an overload, memory stays bounded, and the next call runs. (The client waits 60 s: here it shares the
    server's process and, on a machine others keep busy, its 500 connections take seconds of CPU to open.)"""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with running_server(ServerConfig(LocalSandbox(timeout_s=10))) as url:
        result = asyncio.run(run_load(url, concurrency=500, run_timeout=6, compile_timeout=1, client_timeout=60))
        after = post(url, "print(1)", run_timeout=5, compile_timeout=0)
        stats = httpx.get(f"{url}/v1/load").json()
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result["answered_in_time_share"] == 1.0, result["statuses"]
    assert set(result["statuses"]) <= {"SandboxError/Error (overloaded)", "Failed/TimeLimitExceeded (timeout)"}
    assert after["status"] == "Success" and stats["running"] == stats["queued"] == 0
    assert grown_mb < 1024, grown_mb


def test_a_flood_is_answered_in_time_and_a_probe_still_runs():
    """Twelve endless loops on a server with two fresh slots: every answer comes back before the client's
    timeout, none is a success, and a print(1) sent meanwhile succeeds."""
    config = ServerConfig(LocalSandbox(timeout_s=10), fresh_slots=2, quantum_s=0.5)
    with running_server(config) as url:
        result = asyncio.run(
            run_load(url, concurrency=12, run_timeout=3, compile_timeout=1, client_timeout=9, probe_after_s=0.5)
        )
        stats = httpx.get(f"{url}/v1/load").json()
    assert result["answered_in_time_share"] == 1.0 and result["successes"] == 0, result
    assert set(result["statuses"]) <= {"SandboxError/Error (overloaded)", "Failed/TimeLimitExceeded (timeout)"}
    assert result["probe"]["status"] == "Success/Finished (ok)" and result["probe"]["stdout"] == "1\n"
    assert stats["running"] == 0 and stats["queued"] == 0


def test_a_client_that_leaves_takes_its_program_with_it():
    with running_server(ServerConfig(LocalSandbox(timeout_s=60))) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/run_code", json={"code": SLEEP, "language": "python", "run_timeout": 60}, timeout=1)
        wait_for(lambda: httpx.get(f"{url}/v1/load").json()["running"] == 0)
        stats = httpx.get(f"{url}/v1/load").json()
    assert stats["cancelled"] == 1 and stats["started"] == 1


def test_shutdown_kills_what_runs_and_drops_what_waits():
    sandbox = LocalSandbox(timeout_s=60)
    scheduler = RunScheduler(max_running=1, fresh_slots=1)
    work = lambda deadline, watch: sandbox.run(SLEEP, deadline=deadline, watch=watch)  # noqa: E731
    running = scheduler.submit(work, time.monotonic() + 60, 60, 512)
    waiting = scheduler.submit(work, time.monotonic() + 60, 60, 512)
    wait_for(lambda: bool(running.roots))
    scheduler.shutdown()
    result, _ = running.future.result(timeout=30)
    assert result.status == "killed" and waiting.future.cancelled()


class FlakySandbox:
    """Answers `overloaded` the first `faults` times (a double standing in for a busy server's answers,
    which the real-server test below produces)."""

    timeout_s = 1.0

    def __init__(self, faults: int):
        self.faults, self.calls = faults, 0

    def run(self, code, *, stdin="", timeout_s=None):
        self.calls += 1
        if self.calls <= self.faults:
            return SandboxResult(status="overloaded", stderr="the sandbox server was overloaded")
        return SandboxResult(status="ok", stdout="42\n", exit_code=0)


def test_the_interpreter_retries_a_fault_within_its_budget():
    text, result = CodeInterpreter(FlakySandbox(2), fault_retries=2).execute("print(42)")
    assert (result.status, text) == ("ok", "42")
    text, result = CodeInterpreter(FlakySandbox(5), fault_retries=2).execute("print(42)")
    assert result.status == "overloaded" and "overloaded" in text
    flaky = FlakySandbox(5)
    CodeInterpreter(flaky, fault_retries=5, fault_budget_s=0.5).execute("print(42)")
    assert flaky.calls == 1  # a second attempt (up to its 1 s limit) could not end within the 0.5 s budget


class PrefilledReTool(ReToolEnv):
    def response_prefix(self) -> str:
        return "<code>\n```python\nprint(6 * 7)\n```\n</code>"


def test_an_overloaded_sandbox_fails_the_rollout_not_the_model():
    """The code tool talks to a real server whose only slot is held: its calls are answered `overloaded`,
    retried, then the rollout ends as an error (left out of the update, counted), with no reward given."""
    tiny = load_model("tiny-llama", dtype=torch.float64, device="cpu")
    with running_server(ServerConfig(LocalSandbox(timeout_s=30), workers=1, fresh_slots=1, interactive_slots=0)) as url:
        holder = threading.Thread(target=lambda: post(url, "import time\ntime.sleep(20)", 20, 0, margin=10))
        holder.start()
        wait_for(lambda: httpx.get(f"{url}/v1/load").json()["running"] == 1)
        tools = load_tools(ROOT / "tools" / "code_interpreter.yaml")
        interpreter = tools["code_interpreter"].interpreter
        interpreter.sandbox = SandboxFusionSandbox(url, timeout_s=1, compile_timeout_s=0.5, http_slack_s=5)
        interpreter.fault_retries = 1
        engine = Engine(
            tiny, EngineOptions(drafter="srt", device="cpu", max_batch=4, max_context=1024, calibrate=False)
        )
        options = EnvConfig(max_turns=2, max_tokens_per_turn=8, max_response_tokens=160, n_samples=1)
        ctrl = MultiTurnController(
            AsyncEngine(engine), tiny.tokenizer, options, PrefilledReTool, tools, tiny.eos_token_ids
        )
        try:
            (traj,) = asyncio.run(ctrl.run(arithmetic_tasks(1)))
        finally:
            ctrl.engine.close()
        holder.join()
    assert traj.finish_reason == "error" and traj.error.startswith("tool fault (code_interpreter, overloaded)")
    (call,) = traj.tool_calls
    assert call.fault and call.status == "overloaded" and traj.reward == 0.0
    assert token_metrics([traj])["rollout/error_tokens"] == traj.model_tokens
