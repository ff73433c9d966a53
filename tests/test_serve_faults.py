"""Faults stay with their request in `srt-agent serve`, on our engine here (real HTTP, the tiny Llama); on
real vLLM in tests/faults/test_faults_serve_vllm.py. A battery of malformed requests (tests/helpers/serve_battery.py)
gets 4xx answers or sensible 200s, never a 500, and the server serves on; a backend step that raises fails
the requests in flight (their rollouts recorded as errors) and nothing else; /health says how the backend is."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch
from helpers.serve_battery import run_battery, serves_normally

from srt_agent.agent import EnvConfig, Task
from srt_agent.models import load_model
from srt_agent.serve import RolloutServer, run_agents_async

pytestmark = pytest.mark.usefixtures("one_thread")
MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server():
    tiny = load_model(MODEL, dtype=torch.float64, device="cpu")
    engine = {"backend": "engine", "drafter": "srt", "device": "cpu", "max_batch": 8, "max_context": 256}
    server = RolloutServer.from_config(EnvConfig(model=MODEL, engine={**engine, "calibrate": False}), loaded=tiny)
    yield server
    server.close()


@pytest.fixture(scope="module")
def url(server):
    with server.running() as url:
        yield url


def test_the_malformed_battery_gets_no_500(url):
    answers = run_battery(url, MODEL)
    assert [a for a in answers if a["status"] >= 500] == []
    assert {a["status"] for a in answers} <= {200, 400, 404, 422}
    by_name = {a["name"]: a for a in answers}
    assert by_name["chat seed=1208925819614629174706176"]["status"] == 400
    assert "seed" in by_name["chat seed=1208925819614629174706176"]["detail"]
    assert by_name["chat top_k=1000000"]["status"] == 200  # as large as the vocabulary: no filter
    assert by_name["chat max_tokens=1000000000"]["status"] == 200  # capped by the context
    assert serves_normally(url, MODEL)


def test_health_reports_ready(url):
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ready" and health["restarts"] == 0


def test_a_failing_step_fails_its_rollouts_and_the_server_serves_on(server, url, monkeypatch):
    """A step that raises (a test double: our engine offers no way to make its step fail) answers the requests
    in it with an error; agents whose request failed get an "error" rollout (not trained), the others and
    later requests are served."""
    engine = server.backend.engine
    real_step, steps = engine.step, []

    def step():
        steps.append(1)
        if len(steps) == 1:
            raise RuntimeError("a fault in the step")
        return real_step()

    monkeypatch.setattr(engine, "step", step)

    async def agent(base_url: str, task: Task) -> float:
        chat = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        try:
            await chat.chat.completions.create(model=MODEL, messages=task.prompt, max_tokens=4, seed=3)
        except openai.InternalServerError:
            pass  # an agent that carries on after a failed request: its rollout is still an error
        await chat.chat.completions.create(model=MODEL, messages=task.prompt, max_tokens=4, seed=4)
        return 1.0

    tasks = [Task([{"role": "user", "content": f"task {i}"}], "1") for i in range(3)]
    run = asyncio.run(run_agents_async(server, url, agent, tasks))
    failed = [t for t in run.trajectories if t.finish_reason == "error"]
    assert failed and all("a request of the rollout failed" in t.error and t.reward == 0.0 for t in failed)
    assert all("a fault in the step" in t.error for t in failed)
    health = httpx.get(f"{url}/health").json()
    assert (health["status"], health["step_failures"]) == ("ready", 1)
    assert serves_normally(url, MODEL)
