"""Code tools: the code interpreter and its sandboxes (bubblewrap, SandboxFusion, Docker), each loaded on
first use from the sandbox registry (factory.py)."""

from .base import (
    SANDBOX_FAULTS,
    SANDBOX_STATUSES,
    CodeSandbox,
    SandboxResult,
    SandboxStatus,
    SandboxUnavailable,
    ServedSandbox,
)
from .factory import SANDBOX_KINDS, make_sandbox, served_kinds
from .interpreter import CodeInterpreter, format_result, truncate_middle

#: the sandbox classes this package exports, loaded from their registry entries on first use
_LAZY = {"LocalSandbox": "local", "SandboxFusionSandbox": "sandbox_fusion", "DockerSandbox": "docker"}

__all__ = [
    "SANDBOX_FAULTS",
    "SANDBOX_KINDS",
    "SANDBOX_STATUSES",
    "CodeInterpreter",
    "CodeSandbox",
    "DockerSandbox",
    "LocalSandbox",
    "SandboxFusionSandbox",
    "SandboxResult",
    "SandboxStatus",
    "SandboxUnavailable",
    "ServedSandbox",
    "format_result",
    "make_sandbox",
    "served_kinds",
    "truncate_middle",
]


def __getattr__(name: str):
    if name in _LAZY:
        return SANDBOX_KINDS[_LAZY[name]].load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
