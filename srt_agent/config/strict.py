"""What every part of the env config shares: strict models, the error that names the file and key, dotted imports."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the file and the key."""


class Strict(BaseModel):
    """A config section that refuses unknown keys."""

    model_config = ConfigDict(extra="forbid")


def import_dotted(path: str) -> Any:
    """Import ``package.module.Name``."""
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {path!r}: {exc}") from None
