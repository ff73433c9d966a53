"""The one sandbox registry: every code sandbox by name, `make_sandbox("local" | "sandbox_fusion" | "docker",
**options)` builds one.

A new sandbox is one entry here: its class as ``module:Class``, imported on first use (a sandbox that needs
an optional package, Docker's SDK, costs nothing until chosen), and whether it runs programs itself, so that
`srt-agent sandbox serve` can put it behind SandboxFusion's API (a :class:`~.base.ServedSandbox`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..registry import Registry, load
from .base import CodeSandbox


@dataclass(frozen=True)
class SandboxEntry:
    """A sandbox: its class as ``module:Class``; `served`: it runs programs itself (a ServedSandbox)."""

    target: str
    served: bool = False

    def load(self) -> type:
        return load(self.target, __package__)


SANDBOX_KINDS: Registry[SandboxEntry] = Registry(
    "sandbox kind",
    {
        "local": SandboxEntry(".local:LocalSandbox", served=True),
        "sandbox_fusion": SandboxEntry(".sandbox_fusion:SandboxFusionSandbox"),
        "docker": SandboxEntry(".docker_sandbox:DockerSandbox", served=True),
    },
)


def served_kinds() -> list[str]:
    """The sandboxes `srt-agent sandbox serve` serves, in the registry's order."""
    return [name for name, entry in SANDBOX_KINDS.items() if entry.served]


def make_sandbox(kind: str = "local", **options: Any) -> CodeSandbox:
    """Build the sandbox `kind` with its constructor `options` (e.g. `timeout_s=5`)."""
    key = kind.replace("-", "_").lower()
    if key not in SANDBOX_KINDS:
        raise SANDBOX_KINDS.unknown(kind)
    cls = SANDBOX_KINDS[key].load()
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for the {key!r} sandbox ({cls.__name__}): {exc}") from exc
