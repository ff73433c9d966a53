"""The real path: SmolLM2 cold-started on executed traces, then a GRPO step with SRT rollouts and a compare run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from srt_agent.config import load_env_config
from srt_agent.models import cache_root, load_model
from srt_agent.rl.trainer import Trainer
from srt_agent.runner.device_info import detect_device

ROOT = Path(__file__).resolve().parents[1]


SMALL_COLD_START = [
    "cold_start.n=24",
    "cold_start.lr=5e-5",
    "cold_start.batch_size=4",
    "cold_start.eval_tasks=4",
    "max_tokens_per_turn=96",
    "max_response_tokens=256",
    "engine.max_batch=4",
    "engine.max_context=768",
]


@pytest.fixture
def fresh_cold_start_cache(tmp_path, monkeypatch):
    """An empty cold-start cache (so the cold start trains, whatever ran before) sharing the converted model."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_root() / "models")
    monkeypatch.setenv("SRT_AGENT_CACHE_DIR", str(cache))


def main_job(*overrides: str):
    """The main job's env with a short cold start and small rollouts."""
    return load_env_config(ROOT / "envs" / "retool_train.yaml", [*SMALL_COLD_START, *overrides])


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_cold_start_cache")
def test_cold_start_teaches_the_tool_and_a_grpo_step_runs(tmp_path):
    config = main_job("train.prompts_per_step=2", "n_samples=2")
    # Its own copy: training changes the weights of the model the engines run.
    report = Trainer(
        config.for_run(steps=1, compare=["none"]), tmp_path / "run", loaded=load_model("smollm2", device="cpu")
    ).run()
    cold = report["cold_start"]
    losses = [s["loss"] for s in cold["sft"]]
    assert losses[-1] < losses[0]
    assert cold["before"]["tool_call_rate"] == 0.0  # the plain model never writes a <code> block
    assert cold["after"]["tool_call_rate"] >= 0.5  # after SFT on executed traces it calls the interpreter
    (step,) = report["steps"]
    assert step["env/tool_call_rate"] > 0 and step["srt/forced_tokens"] > 0
    assert step["compare/none/gen_s"] > 0
    assert step["training/rollout_logprob_diff_mean"] < 1e-3  # engine and trainer agree on the log-probs
    assert step["training/nonfinite_updates"] == 0.0


@pytest.mark.slow
@pytest.mark.skipif(
    not detect_device(torch.device("cpu")).native_bf16,
    reason="hardware: bfloat16 is emulated on this CPU (no AVX-512 BF16 or AMX): SmolLM2's cold start takes over 10 minutes; "
    "tests/test_rl_mixed_precision.py and tests/test_numerics.py check the float32 masters on a tiny model",
)
@pytest.mark.usefixtures("fresh_cold_start_cache")
def test_a_bfloat16_cold_start_teaches_the_tool_as_the_float32_one_does(tmp_path, monkeypatch):
    """``train.dtype: bfloat16`` computes in bfloat16 over float32 weights and AdamW state. With bfloat16
    weights the cold start's updates rounded away and held-out tool calls stayed at 0% (float32: most)."""
    config = main_job("engine.backend=engine", "train.dtype=bfloat16")
    monkeypatch.setattr(Trainer, "_loop", lambda self, *args: None)  # the cold start and its report; no RL step
    report = Trainer(config.for_run(steps=1), tmp_path / "run", loaded=load_model("smollm2", device="cpu")).run()
    cold = report["cold_start"]
    assert not cold["cached"]
    losses = [s["loss"] for s in cold["sft"]]
    assert losses[-1] < losses[0]
    assert cold["before"]["tool_call_rate"] == 0.0
    assert cold["after"]["tool_call_rate"] >= 0.5  # as the float32 cold start above
