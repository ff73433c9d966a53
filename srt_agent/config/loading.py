"""Reading an env YAML: parse it, apply ``KEY=VALUE`` overrides, validate (errors name the file and the
key) and resolve relative paths."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .schema import EnvConfig
from .strict import ConfigError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict:
    """Parse a YAML mapping; malformed YAML raises :class:`ConfigError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: malformed YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate_config(model: type[M], data: dict, path: str | Path) -> M:
    """Validate `data` against `model`; every error names the file and the dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(part) for part in err["loc"]) or "(top level)"
            lines.append(f"{path}: {key}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set dotted keys from ``KEY=VALUE`` strings (values parsed as YAML), e.g. ``train.lr=1e-5``."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. train.steps=8")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: the value is not valid YAML") from None
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_env_config(path: str | Path, overrides: list[str] | None = None) -> EnvConfig:
    """Read and validate an env YAML (with ``KEY=VALUE`` overrides); relative paths become absolute."""
    path = Path(path)
    config = validate_config(EnvConfig, apply_overrides(read_yaml(path), overrides or []), path)
    base = path.resolve().parent
    if config.tools is not None and not config.tools.is_absolute():
        config.tools = (base / config.tools).resolve()
    if config.dataset.task_source().path:
        source = Path(config.dataset.source)
        config.dataset.source = str(source if source.is_absolute() else (base / source).resolve())
    traces = config.cold_start.source_path(base)
    if traces is not None:
        config.cold_start.source = str(traces)
    return config
