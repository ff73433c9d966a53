"""Rollout backends: one seam (:class:`RolloutBackend`, with declared :class:`Capabilities`) and a registry
of its implementations by name: our engine (the exact reference) and vLLM.

:func:`make_backend` starts the one the env config's ``engine.backend`` names; ``auto`` takes the first
registered backend that can serve the run (:func:`choose_backend`). Adding a backend is registering it in
:data:`REGISTRY` (see docs/architecture.md, "How to add a backend").
"""

from __future__ import annotations

from collections.abc import Callable

from ..drafting.registry import vllm_drafters
from ..registry import Registry, load
from .base import Capabilities, Refusal, Registered, RolloutBackend, RunAheadControl
from .vllm import VLLMUnavailable, vllm_missing

#: name → its entry (``REGISTERED`` in its module, imported when first asked for, with torch: the names cost
#: nothing, and the config checks ``engine.backend`` against them when it is read); ``auto`` tries them in
#: this order (our engine, last, serves every run)
REGISTRY: Registry[Registered] = Registry(
    "backend", {"vllm": ".vllm.backend:REGISTERED", "engine": ".engine_backend:REGISTERED"}, package=__name__
)
#: names this package exports from modules that import torch, loaded on first use
_LAZY = {"EngineBackend": ".engine_backend", "VLLM_IDENTICAL_NOTE": ".vllm.exact_sampling"}
BACKENDS = (*REGISTRY, "auto")  # what ``engine.backend`` may name

__all__ = [
    "BACKENDS",
    "REGISTRY",
    "vllm_drafters",
    "VLLM_IDENTICAL_NOTE",
    "Capabilities",
    "EngineBackend",
    "Refusal",
    "Registered",
    "RolloutBackend",
    "RunAheadControl",
    "VLLMUnavailable",
    "choose_backend",
    "make_backend",
    "unknown_backend",
    "vllm_missing",
]


def __getattr__(name: str):
    if name in _LAZY:
        return load(f"{_LAZY[name]}:{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unknown_backend(name: str) -> str | None:
    """Why ``engine.backend: name`` names no backend (None when it names one)."""
    return None if name in BACKENDS else f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}"


def choose_backend(requested: str, drafter: str, run_ahead: bool = False, loaded=None) -> tuple[str, str]:
    """(backend, why) for ``engine.backend: requested`` serving `drafter` (with run-ahead if `run_ahead`) on
    `loaded`'s model (None: the model is not checked). A named backend that cannot serve the run fails with
    one line (vLLM: missing, no counterpart of the drafter, run-ahead, a model it cannot serve); ``auto``
    takes the first registered backend that can, and says why."""
    if (unknown := unknown_backend(requested)) is not None:
        raise ValueError(unknown)
    if requested != "auto":
        refused = REGISTRY[requested].refusal(drafter, run_ahead, loaded)
        if refused is not None:
            raise refused.error
        return requested, f"engine.backend: {requested}"
    passed_over = []
    for name, registered in REGISTRY.items():
        refused = registered.refusal(drafter, run_ahead, loaded)
        if refused is None:
            return name, "engine.backend: auto, and " + ("; ".join(passed_over) or registered.chosen)
        passed_over.append(refused.reason)
    raise ValueError("engine.backend: auto, and no backend can serve this run: " + "; ".join(passed_over))


def make_backend(
    config, loaded, drafter: str | None = None, run_ahead=None, log: Callable[[str], None] | None = None
) -> RolloutBackend:
    """The backend the env config asks for, serving `loaded` with `drafter` (default: the config's);
    `log` gets one line saying which backend runs and why."""
    drafter = drafter or config.engine.drafter
    name, why = choose_backend(config.engine.backend, drafter, run_ahead is not None, loaded)
    made = REGISTRY[name].factory(config, loaded, drafter, run_ahead)
    if log is not None:
        log(f"backend for {drafter}: {made.describe()} ({why})")
    return made
