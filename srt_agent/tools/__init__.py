"""Code tools: the code interpreter and its sandboxes (bubblewrap, SandboxFusion, Docker)."""

from .base import (
    SANDBOX_FAULTS,
    SANDBOX_STATUSES,
    CodeSandbox,
    SandboxResult,
    SandboxStatus,
    SandboxUnavailable,
)
from .docker_sandbox import DockerSandbox
from .factory import SANDBOX_KINDS, make_sandbox
from .interpreter import CodeInterpreter, format_result, truncate_middle
from .local import LocalSandbox
from .sandbox_fusion import SandboxFusionSandbox

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
    "format_result",
    "make_sandbox",
    "truncate_middle",
]
