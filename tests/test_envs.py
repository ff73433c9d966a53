"""Every shipped env file validates and runs with the commands it is for, on a tiny random model.

`srt-agent rollout` and `srt-agent train` (cold start included) run each file for one step with the
file's own settings except the model and the sizes (fewer tasks, samples and tokens), so a file whose
settings break a command (retool_arith's few-shot prompt once broke the cold start) fails here in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.config import load_env_config
from srt_agent.models import cache_root, load_tokenizer
from srt_agent.tools.local import bwrap_path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "envs").glob("*.yaml"))
# verifiers environments bring their own tasks, tools and rewards: tests/test_verifiers_env.py runs them
VERIFIERS_FILES = [p for p in SHIPPED if str(yaml.safe_load(p.read_text()).get("env", "")).startswith("verifiers:")]
# agents written against the openai client (agent:) run from examples/: tests/test_tool_agent.py runs them
AGENT_FILES = [p for p in SHIPPED if yaml.safe_load(p.read_text()).get("agent")]
ENV_FILES = [p for p in SHIPPED if p not in VERIFIERS_FILES + AGENT_FILES]
runner = CliRunner()
SMALL = [
    "--set", "max_tokens_per_turn=8", "--set", "max_response_tokens=48",
    "--set", "engine.max_context=512", "--set", "engine.calibrate=false", "--set", "engine.max_batch=8",
]  # fmt: skip
TRAIN = [
    "--model", "tiny-llama", "--steps", "1", "--compare", "none", "--backend", "engine",
    "--set", "n_samples=2", "--set", "train.prompts_per_step=2", "--set", "train.micro_batch_tokens=256",
    "--set", "cold_start.n=4", "--set", "cold_start.eval_tasks=2", "--set", "cold_start.batch_size=2",
    *SMALL,
]  # fmt: skip

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


def docker_engine_if_used(path: Path) -> None:
    """An env file whose tools run on Docker needs an engine: a machine skip where none answers."""
    tools = yaml.safe_load(Path(load_env_config(path).tools).read_text())["tools"]
    if any(tool["config"].get("sandbox") == "docker" for tool in tools):
        from helpers.sandboxes import docker_client_or_skip

        docker_client_or_skip()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache dir (no cold start from an earlier run) that still sees the converted SmolLM2."""
    load_tokenizer("smollm2")  # converts the GGUF into the user cache once
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_root() / "models")
    monkeypatch.setenv("SRT_AGENT_CACHE_DIR", str(cache))
    return cache


def test_the_shipped_env_files_are_all_covered():
    assert {p.name for p in ENV_FILES} >= {
        "retool_arith.yaml",
        "retool_train.yaml",
        "retool_long.yaml",
        "reasoning_gym_mix.yaml",
    }
    assert [p.name for p in VERIFIERS_FILES] == ["vf_calculator.yaml"]
    assert [p.name for p in AGENT_FILES] == ["openai_tools.yaml"]


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.stem)
def test_env_file_validates(path):
    config = load_env_config(path)
    assert config.name == path.stem and config.tools and Path(config.tools).is_file()
    assert config.dataset.tasks(), path


@needs_bwrap
@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.stem)
def test_env_file_rolls_out(path, tmp_path):
    docker_engine_if_used(path)
    out = tmp_path / "r.jsonl"
    args = ["rollout", str(path), "--model", "tiny-llama", "--limit", "1", "--n", "2", "--backend", "engine"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.slow
@needs_bwrap
@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.stem)
def test_env_file_trains_one_step(path, tmp_path, fresh_cache):
    """The cold start's traces really run in the sandbox and come out right, then one RL step."""
    docker_engine_if_used(path)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", str(path), "--out", str(out), *TRAIN])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["cold_start"]["traces"] >= 3 and len(report["steps"]) == 1, report["cold_start"]
