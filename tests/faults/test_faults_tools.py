"""Faults at the tools: a tool call that crashes, hangs or returns garbage inside the multi-turn
controller, and a sandbox process killed from outside mid-run.

The faulty trajectory records the failure and shows it to the model as its observation; every other
trajectory is token for token the one a fault-free run produces; no process, thread, fd, temp file,
cgroup, KV slot or drafter request is left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch
from helpers.fault_injection import HostState, InjectedFault, engine_leaks, host_leaks
from helpers.faults_report import FaultRecord

from srt_agent.agent import EnvConfig, MultiTurnController, ReToolEnv, load_tools
from srt_agent.agent.env import ToolResult
from srt_agent.config import InterpreterConfig
from srt_agent.engine import AsyncEngine, Engine, EngineOptions
from srt_agent.models import load_model
from srt_agent.sources.arithmetic import arithmetic_tasks
from srt_agent.tools import LocalSandbox
from srt_agent.tools.cgroup import CgroupLimiter
from srt_agent.tools.local import bwrap_path

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "code_interpreter.yaml")
FAULT_MARK = "'inject a fault here'"
TOOL_TIMEOUT_S = 8.0  # well past a sandbox call on a loaded machine (its own timeout is 5 s)


@pytest.fixture(scope="module")
def tiny():
    """A random Llama with SmolLM2's tokenizer, in float64 so runs are bit-reproducible."""
    return load_model("tiny-llama", dtype=torch.float64, device="cpu")


def code_block(expr: str) -> str:
    return f"<code>\n```python\nprint({expr})\n```\n</code>"


class PrefilledReTool(ReToolEnv):
    """ReTool whose first turn opens with the task's code block (a random model writes none itself)."""

    def response_prefix(self) -> str:
        return self.task.extra_info["prefix"]


class FaultyTool:
    """The real code interpreter, except for programs carrying FAULT_MARK: those crash, hang or get garbage."""

    def __init__(self, inner, mode: str):
        self.inner, self.mode, self.name, self.schema = inner, mode, inner.name, inner.schema
        self.release = threading.Event()  # lets a hung call finish once the test is over
        self.fired = 0

    def __call__(self, arguments: dict):
        if FAULT_MARK not in arguments.get("code", ""):
            return self.inner(arguments)
        self.fired += 1
        if self.mode == "crash":
            raise InjectedFault("the sandbox crashed")
        if self.mode == "hang":
            self.release.wait(60)
            return ToolResult("an answer nobody waits for any more")
        return {"stdout": "not a ToolResult"}


def tasks(faulty: int | None):
    out = arithmetic_tasks(3, seed=1)
    for i, task in enumerate(out):
        task.extra_info["prefix"] = code_block(FAULT_MARK if i == faulty else f"{i} * 7")
    return out


def run(tiny, tools, task_list):
    engine = Engine(tiny, EngineOptions(drafter="srt", device="cpu", max_batch=4, max_context=1024, calibrate=False))
    config = EnvConfig(
        max_turns=3, max_tokens_per_turn=8, max_response_tokens=160, n_samples=2, tool_timeout_s=TOOL_TIMEOUT_S
    )
    controller = MultiTurnController(
        AsyncEngine(engine), tiny.tokenizer, config, PrefilledReTool, tools, tiny.eos_token_ids
    )
    try:
        return asyncio.run(asyncio.wait_for(controller.run(task_list), 120)), engine
    finally:
        controller.engine.close()


def shape(traj):
    return traj.response_ids, traj.response_mask, traj.reward, traj.finish_reason, [c.status for c in traj.tool_calls]


EXPECTED = {
    "crash": ("crash", "failed: InjectedFault: the sandbox crashed"),
    "hang": ("timeout", f"did not answer within {TOOL_TIMEOUT_S:g} s"),
    "garbage": ("bad_result", "returned dict, not a ToolResult"),
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_a_faulty_tool_call_stays_in_its_trajectory(tiny, ledger, mode):
    interpreter = load_tools(TOOLS, InterpreterConfig(max_output_chars=64, timeout_s=5))["code_interpreter"]
    reference, _ = run(tiny, {"code_interpreter": interpreter}, tasks(faulty=None))
    host = HostState.now()
    tool = FaultyTool(interpreter, mode)
    try:
        trajs, engine = run(tiny, {"code_interpreter": tool}, tasks(faulty=1))
    finally:
        tool.release.set()
    faulty = [t for t in trajs if t.task_index == 1]
    others = [(t, r) for t, r in zip(trajs, reference) if t.task_index != 1]
    hit = [t.request_id for t, r in others if shape(t) != shape(r)]
    leaks = host_leaks(host) + engine_leaks(engine)
    ledger.record(FaultRecord("tool call", mode, tool.fired, len(others), len(hit), len(leaks)))
    assert hit == [] and leaks == []
    status, message = EXPECTED[mode]
    for traj in faulty:  # recorded, shown to the model, and the episode went on
        (call,) = traj.tool_calls
        assert call.status == status and message in call.output
        assert traj.error is None and traj.num_turns == 2
        assert message in tiny.tokenizer.decode([t for t, m in zip(traj.response_ids, traj.response_mask) if m == 0])


def cgroups_of_this_process() -> set[str]:
    limiter = CgroupLimiter.detect()
    if limiter is None:
        return set()
    return {str(p) for base in {limiter.memory_base, limiter.pids_base} for p in base.glob(f"run-{os.getpid()}-*")}


def kill_sandbox_of(name: str, timeout_s: float = 20.0) -> int:
    """SIGKILL the bubblewrap process (our child) whose sandbox runs a process named `name`; its pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.name() != name:
                    continue
                outer = next(p for p in proc.parents() if p.ppid() == os.getpid())
            except (psutil.Error, StopIteration):
                continue
            os.kill(outer.pid, signal.SIGKILL)
            return outer.pid
        time.sleep(0.05)
    raise AssertionError(f"no sandboxed process named {name!r} showed up")


VICTIM = "import ctypes, time\nctypes.CDLL(None).prctl(15, b'srt-victim', 0, 0, 0)\nprint('started', flush=True)\ntime.sleep(30)\n"


def test_a_sandbox_killed_mid_run(ledger):
    """Six programs at once; the sandbox of one is SIGKILLed from outside while it runs."""
    sandbox = LocalSandbox(timeout_s=20, memory_mb=256)
    good = [f"import time\ntime.sleep(0.5)\nprint({i} * 11)\n" for i in range(5)]
    host, groups = HostState.now(), cgroups_of_this_process()
    with ThreadPoolExecutor(6) as pool:
        victim = pool.submit(sandbox.run, VICTIM)
        runs = [pool.submit(sandbox.run, code) for code in good]
        kill_sandbox_of("srt-victim")
        result = victim.result(timeout=30)
        results = [r.result(timeout=30) for r in runs]
    hit = [i for i, r in enumerate(results) if (r.status, r.stdout) != ("ok", f"{i * 11}\n")]
    leaks = host_leaks(host) + sorted(cgroups_of_this_process() - groups)
    leaks += [str(p.pid) for p in psutil.process_iter(["name"]) if p.info["name"] == "srt-victim"]
    ledger.record(FaultRecord("sandbox", "SIGKILL mid-run", 1, len(good), len(hit), len(leaks)))
    assert hit == [] and leaks == []
    assert result.status == "killed" and result.exit_code == -signal.SIGKILL and result.stdout == "started\n"


def test_a_docker_container_killed_mid_run(ledger):
    """Six programs at once in Docker containers; the container of one is killed from outside (through the
    engine) while it runs. Nothing is left: no container (the warm pool's included), thread or descriptor."""
    from helpers.sandboxes import containers_left, docker_client_or_skip, recorded_containers

    from srt_agent.tools import DockerSandbox

    engine = docker_client_or_skip()
    host = HostState.now()
    client = type(engine).from_env()
    created = recorded_containers(client)
    sandbox = DockerSandbox(timeout_s=20, memory_mb=256, client=client)
    good = [f"import time\ntime.sleep(0.5)\nprint({i} * 11)\n" for i in range(5)]
    started: list[int] = []
    with ThreadPoolExecutor(6) as pool:
        victim = pool.submit(
            sandbox.run, "import time\nprint('started', flush=True)\ntime.sleep(30)\n", watch=started.append
        )
        runs = [pool.submit(sandbox.run, code) for code in good]
        deadline = time.monotonic() + 30
        while not started and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the program prints, then sleeps
        (container,) = [c for c in client.containers.list() if c.attrs["State"]["Pid"] == started[0]]
        container.kill()
        result = victim.result(timeout=30)
        results = [r.result(timeout=30) for r in runs]
    sandbox.close()
    client.close()
    hit = [i for i, r in enumerate(results) if (r.status, r.stdout) != ("ok", f"{i * 11}\n")]
    leaks = host_leaks(host) + containers_left(engine, created)
    ledger.record(FaultRecord("sandbox", "Docker container killed mid-run", 1, len(good), len(hit), len(leaks)))
    assert hit == [] and leaks == []
    assert result.status == "killed" and result.exit_code == -signal.SIGKILL and result.stdout == "started\n"
