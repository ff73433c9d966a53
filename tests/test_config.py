"""Env configs: the shipped YAMLs validate; bad files fail with the file, key or line named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from srt_agent.agent.env import Env
from srt_agent.agent.retool import ReToolEnv
from srt_agent.config import ConfigError, load_env_config

ENVS = Path(__file__).resolve().parents[1] / "envs"


@pytest.mark.parametrize("path", sorted(ENVS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_env_configs_validate(path):
    config = load_env_config(path)
    assert isinstance(config.env_class(), type) and issubclass(config.env_class(), Env)
    if config.tools is not None:
        assert config.tools.is_absolute() and config.tools.is_file()


def test_retool_arith_config():
    config = load_env_config(ENVS / "retool_arith.yaml")
    assert config.env_class() is ReToolEnv
    assert config.tools == (ENVS.parent / "tools" / "code_interpreter.yaml").resolve()
    tasks = config.dataset.tasks(limit=3)
    assert len(tasks) == 3 and tasks[0].data_source == "srt_agent/arithmetic"


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "env.yaml"
    path.write_text(text)
    return path


def test_unknown_key_is_named_with_the_file(tmp_path):
    path = _write(tmp_path, "name: x\nsampling:\n  temprature: 0.5\n")
    with pytest.raises(ConfigError, match=r"env.yaml: sampling.temprature: Extra inputs are not permitted"):
        load_env_config(path)


def test_bad_value_is_named(tmp_path):
    path = _write(tmp_path, "max_turns: 0\nsampling: {top_p: 2}\n")
    with pytest.raises(ConfigError) as info:
        load_env_config(path)
    message = str(info.value)
    assert f"{path}: max_turns:" in message and f"{path}: sampling.top_p:" in message


def test_unknown_backend_names_the_registered_ones(tmp_path):
    """``engine.backend`` is checked against the backend registry's names, without importing a backend."""
    path = _write(tmp_path, "engine:\n  backend: vlm\n")
    with pytest.raises(ConfigError, match=r"engine.backend: .*unknown backend 'vlm'; choose one of vllm, engine, auto"):
        load_env_config(path)


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, "name: x\nsampling:\n  temperature: [1.0\nmax_turns: 2\n")
    with pytest.raises(ConfigError, match=r"env.yaml:4:\d+: malformed YAML"):
        load_env_config(path)


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_env_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_env_config(_write(tmp_path, "- a\n- b\n"))


def test_unimportable_env_class(tmp_path):
    config = load_env_config(_write(tmp_path, "env: srt_agent.agent.nowhere.Env\n"))
    with pytest.raises(ConfigError, match="cannot import 'srt_agent.agent.nowhere.Env'"):
        config.env_class()
    with pytest.raises(ConfigError, match="env: Value error, expected a dotted path"):
        load_env_config(_write(tmp_path, "env: ReToolEnv\n"))


def test_relative_dataset_path_resolves_against_the_config(tmp_path):
    from srt_agent.config.tasks import save_tasks
    from srt_agent.sources.arithmetic import arithmetic_tasks

    (tmp_path / "data").mkdir()
    save_tasks(arithmetic_tasks(4, seed=2), tmp_path / "data" / "t.jsonl")
    config = load_env_config(_write(tmp_path, "dataset:\n  source: data/t.jsonl\n  limit: 3\n"))
    assert config.dataset.source == str(tmp_path / "data" / "t.jsonl")
    assert config.dataset.tasks() == arithmetic_tasks(4, seed=2)[:3]
    assert len(config.dataset.tasks(limit=1)) == 1


def test_reading_a_config_imports_no_torch():
    """The config is the root of every run: importing it and validating the shipped YAMLs loads no torch."""
    probe = (
        "import sys\n"
        "import srt_agent.config as config\n"
        "assert 'torch' not in sys.modules, 'import srt_agent.config loaded torch'\n"
        f"for path in {[str(p) for p in sorted(ENVS.glob('*.yaml'))]!r}:\n"
        "    config.load_env_config(path)\n"
        "assert 'torch' not in sys.modules, 'validating a config loaded torch'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
