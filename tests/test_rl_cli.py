"""`srt-agent train` (the Quickstart's main job) end to end on a tiny model, and its clear failures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers.rl_envs import TINY
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.models import cache_root, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
load_tokenizer("smollm2")  # converts the GGUF into the user cache once, before any test swaps the cache dir
runner = CliRunner()


def fresh_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache dir for cold starts that still sees the converted SmolLM2 (its tokenizer)."""
    models = cache_root() / "models"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(models)
    monkeypatch.setenv("SRT_AGENT_CACHE_DIR", str(cache))
    return cache


def test_train_cold_starts_then_steps_and_caches_the_cold_start(tmp_path, monkeypatch):
    fresh_cache(tmp_path, monkeypatch)
    out = tmp_path / "run"
    result = runner.invoke(app, ["train", str(ROOT / "envs" / "retool_train.yaml"), "--out", str(out), *TINY])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    cold = report["cold_start"]
    assert cold["traces"] >= 3 and not cold["cached"] and cold["before"] and cold["after"]
    assert report["steps"][0]["compare/none/gen_s"] > 0 and "vs none" in result.output
    traces = next((tmp_path / "cache" / "coldstart").glob("*/traces.jsonl")).read_text().splitlines()
    assert all(json.loads(t)["tool_calls"][0]["status"] == "ok" for t in traces)
    # A second run with the same settings takes the cold start from the cache and goes straight to RL.
    again = runner.invoke(
        app, ["train", str(ROOT / "envs" / "retool_train.yaml"), "--out", str(tmp_path / "run2"), *TINY]
    )
    assert again.exit_code == 0, again.output
    assert "cold start: cached" in again.output
    assert json.loads((tmp_path / "run2" / "report.json").read_text())["cold_start"]["cached"]


def test_train_reports_bad_input_and_exits_2(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntrain: {algorithm: [\n")
    result = runner.invoke(app, ["train", str(bad)])
    assert result.exit_code == 2 and "malformed YAML" in result.output
    env = ROOT / "envs" / "retool_train.yaml"
    for args, message in [
        (["--algorithm", "reinforce"], "unknown algorithm 'reinforce'"),
        (["--set", "train.lr=-1"], "train.lr"),
        (["--set", "nonsense"], "expected KEY=VALUE"),
        (["--compare", "medusa", "--model", "tiny-llama"], "unknown drafter"),
        (["--resume", str(tmp_path), "--model", "tiny-llama"], "no checkpoint"),
    ]:
        result = runner.invoke(app, ["train", str(env), "--out", str(tmp_path / "o"), *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)


def test_train_without_bubblewrap_names_the_missing_sandbox(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    result = runner.invoke(
        app, ["train", str(ROOT / "envs" / "retool_train.yaml"), "--out", str(tmp_path / "o"), *TINY]
    )
    assert result.exit_code == 2 and "bubblewrap" in result.output


def test_train_stops_before_training_when_the_runtime_cannot_be_used(tmp_path, monkeypatch):
    """A runtime asked for but unusable would have programs run without numpy and sympy, so model code
    importing them scored wrong: training stops with one line naming what to set, before the model loads."""
    missing = tmp_path / "no-runtime"
    monkeypatch.setenv("SRT_SANDBOX_RUNTIME", str(missing))
    out = tmp_path / "o"
    result = runner.invoke(app, ["train", str(ROOT / "envs" / "retool_train.yaml"), "--out", str(out), *TINY])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert f"error: SRT_SANDBOX_RUNTIME={missing} holds no sandbox runtime" in said and "training stops here" in said
    assert "Traceback" not in result.output and not (out / "report.json").exists()
    # plain sandbox use keeps going with the host's interpreter, after a warning
    program = tmp_path / "p.py"
    program.write_text("print(6 * 7)")
    plain = runner.invoke(app, ["sandbox", "run", str(program)])
    assert plain.exit_code == 0 and json.loads(plain.stdout[plain.stdout.index("{") :])["stdout"] == "42\n"


def test_train_with_lora_and_no_peft_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # a test double of a machine without peft
    args = ["--out", str(tmp_path / "o"), "--set", "train.lora.rank=8", *TINY]
    result = runner.invoke(app, ["train", str(ROOT / "envs" / "retool_train.yaml"), *args])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "error: train.lora.rank > 0 trains LoRA adapters through peft" in said, said
    assert "pip install 'peft>=0.13'" in said and "Traceback" not in result.output
