"""The code interpreter the agent calls: run a program, turn its result into text for the model."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .base import SANDBOX_FAULTS, CodeSandbox, SandboxResult
from .factory import make_sandbox

# Keys of a verl tool config that are verl's, not the sandbox's (the concurrency keys are the verl tool's).
VERL_TOOL_KEYS = frozenset({"type", "num_workers", "rate_limit", "enable_global_rate_limit"})
# verl's former SandboxFusion tool (verl <= 0.8) named its options differently; they map onto ours.
SANDBOX_FUSION_TOOL_KEYS = {"default_timeout": "timeout_s", "memory_limit_mb": "memory_mb"}

_STATUS_NOTES = {
    "timeout": "Execution timed out.",
    "memory": "Execution ran out of memory.",
    "output_limit": "Output limit exceeded; the program was stopped.",
    "killed": "The program was killed by a signal.",
    "compile_error": "Compilation failed.",
    "overloaded": "The sandbox was overloaded and stopped the program before its time.",
    "sandbox_error": "The sandbox failed to run the code.",
}
INTERPRETER_KEYS = frozenset({"sandbox", "max_output_chars", "fault_retries", "fault_budget_s"})


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of `text` within `max_chars`, marking what was cut."""
    if len(text) <= max_chars:
        return text
    removed = len(text) - max_chars
    for _ in range(3):  # the marker's own length changes how much is removed; settles in <= 2 rounds
        marker = f"\n...[{removed} characters truncated]...\n"
        removed = len(text) - max_chars + len(marker)
    if len(marker) >= max_chars:
        return text[:max_chars]
    keep = max_chars - len(marker)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]


@dataclass
class CodeInterpreter:
    """Runs model-written code in `sandbox` and formats what the model gets back.

    The text is stdout, then stderr (when non-empty), cut in the middle, then a one-line note for
    anything but a clean exit; `max_output_chars` bounds it all. The caller wraps it in
    `<interpreter>…</interpreter>`. A result that says nothing about the program (a sandbox fault:
    ``overloaded``, ``sandbox_error``) is retried, up to `fault_retries` times while another attempt can end
    within `fault_budget_s` of the call's start (keep it under the env's ``tool_timeout_s``).
    """

    sandbox: CodeSandbox
    max_output_chars: int = 1024
    fault_retries: int = 2
    fault_budget_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_output_chars <= 0:
            raise ValueError(f"max_output_chars must be positive, got {self.max_output_chars!r}")
        if self.fault_retries < 0 or self.fault_budget_s <= 0:
            raise ValueError(
                f"fault_retries must be >= 0 and fault_budget_s > 0, got {self.fault_retries!r}, {self.fault_budget_s!r}"
            )

    @classmethod
    def from_config(cls, config: dict) -> CodeInterpreter:
        """Build from a tool config's ``config`` section (see tools/code_interpreter.yaml): `sandbox`
        names the kind, `max_output_chars` is the interpreter's; verl's own keys (`type`, …) are
        ignored; the rest are sandbox options. A config written for verl's former SandboxFusion tool
        works too (see :func:`from_sandbox_fusion_tool_config`)."""
        config = from_sandbox_fusion_tool_config(config)
        options = {k: v for k, v in config.items() if k not in VERL_TOOL_KEYS | INTERPRETER_KEYS}
        sandbox = make_sandbox(config.get("sandbox", "local"), **options)
        own = {k: config[k] for k in INTERPRETER_KEYS - {"sandbox"} if k in config}
        return cls(sandbox, **own)

    def execute(self, code: str, *, stdin: str = "", timeout_s: float | None = None) -> tuple[str, SandboxResult]:
        """Run `code`, retried on a sandbox fault (see the class docstring); return (text for the model, the
        raw result)."""
        start = time.monotonic()
        result = self.sandbox.run(code, stdin=stdin, timeout_s=timeout_s)
        limit = timeout_s if timeout_s is not None else getattr(self.sandbox, "timeout_s", 0.0)
        for _ in range(self.fault_retries):
            if result.status not in SANDBOX_FAULTS or time.monotonic() - start + limit > self.fault_budget_s:
                break
            result = self.sandbox.run(code, stdin=stdin, timeout_s=timeout_s)
        return format_result(result, self.max_output_chars), result


def from_sandbox_fusion_tool_config(config: dict) -> dict:
    """Our options for a config in the keys of verl's former ``SandboxFusionTool``: ``sandbox_fusion_url``
    (its ``/run_code`` URL) selects the ``sandbox_fusion`` sandbox at that server, ``default_timeout`` and
    ``memory_limit_mb`` become ``timeout_s`` and ``memory_mb``, ``default_language`` must be python.
    Other configs come back unchanged; a key given in both spellings is an error."""
    config = dict(config)
    language = config.pop("default_language", "python")
    if str(language).lower() not in ("python", "python3"):
        raise ValueError(f"default_language={language!r}: the code interpreter runs python only")
    url = config.pop("sandbox_fusion_url", None)
    if url is not None:
        if config.setdefault("sandbox", "sandbox_fusion") != "sandbox_fusion":
            raise ValueError(f"sandbox_fusion_url is set but sandbox is {config['sandbox']!r}")
        config["endpoint"] = str(url).rstrip("/").removesuffix("/run_code")
    for old, new in SANDBOX_FUSION_TOOL_KEYS.items():
        if old in config:
            if new in config:
                raise ValueError(f"both {old!r} and {new!r} are set; keep one")
            config[new] = config.pop(old)
    return config


def format_result(result: SandboxResult, max_chars: int) -> str:
    """The model-facing text of a result (see CodeInterpreter); the status note is never cut."""
    parts = [text.rstrip("\n") for text in (result.stdout, result.stderr) if text.strip()]
    note = _STATUS_NOTES.get(result.status, "")
    if result.status == "error" and not result.stderr.strip():
        note = f"Exited with code {result.exit_code}."
    if not parts:
        return truncate_middle(note or "(no output)", max_chars)
    if not note:
        return truncate_middle("\n".join(parts), max_chars)
    body = truncate_middle("\n".join(parts), max(max_chars - len(note) - 1, 0))
    return truncate_middle(f"{body}\n{note}" if body else note, max_chars)
