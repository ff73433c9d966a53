"""Rollout backends: one seam (:class:`RolloutBackend`), two implementations: our engine (the exact
reference) and vLLM. :func:`make_backend` picks one from the env config's ``engine.backend``."""

from __future__ import annotations

from collections.abc import Callable

from .base import RolloutBackend, RunAheadControl
from .engine import EngineBackend, engine_backend
from .vllm_engine import VLLM_DRAFTERS, VLLMUnavailable, check_vllm_drafter, vllm_missing

BACKENDS = ("engine", "vllm", "auto")

__all__ = [
    "BACKENDS",
    "VLLM_DRAFTERS",
    "EngineBackend",
    "RolloutBackend",
    "RunAheadControl",
    "VLLMUnavailable",
    "choose_backend",
    "make_backend",
]


def choose_backend(
    requested: str, drafter: str, run_ahead: bool = False, model_problem: str | None = None
) -> tuple[str, str]:
    """(backend, why) for ``engine.backend: requested``: ``vllm`` fails with one line when vLLM is missing
    or cannot run the drafter or the model (`model_problem`: why vLLM cannot serve it); ``auto`` takes vLLM
    where it can, else our engine, and says why."""
    if requested not in BACKENDS:
        raise ValueError(f"unknown backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if requested == "engine":
        return "engine", "engine.backend: engine"
    missing = vllm_missing()
    if requested == "vllm":
        if missing:
            raise VLLMUnavailable(missing)
        check_vllm_drafter(drafter)
        if run_ahead:
            raise ValueError("run-ahead runs in our engine only; turn engine.run_ahead off for the vLLM backend")
        if model_problem:
            raise ValueError(model_problem)
        return "vllm", "engine.backend: vllm"
    if missing:
        return "engine", f"engine.backend: auto, and {missing}"
    if drafter not in VLLM_DRAFTERS:
        return "engine", f"engine.backend: auto, and vLLM has no counterpart of drafter {drafter!r}"
    if run_ahead:
        return "engine", "engine.backend: auto, and run-ahead runs in our engine only"
    if model_problem:
        return "engine", f"engine.backend: auto, and {model_problem}"
    return "vllm", "engine.backend: auto, and vLLM is installed"


def make_backend(
    config, loaded, drafter: str | None = None, run_ahead=None, log: Callable[[str], None] | None = None
) -> RolloutBackend:
    """The backend the env config asks for, serving `loaded` with `drafter` (default: the config's);
    `log` gets one line saying which backend runs and why."""
    drafter = drafter or config.engine.drafter
    problem = None
    if config.engine.backend != "engine" and not vllm_missing():
        from ..integrations.vllm.models import unservable

        problem = unservable(loaded)
    backend, why = choose_backend(config.engine.backend, drafter, run_ahead is not None, problem)
    if backend == "engine":
        made = engine_backend(config, loaded, drafter, run_ahead)
    else:
        from .vllm import vllm_backend

        made = vllm_backend(config, loaded, drafter)
    if log is not None:
        log(f"backend for {drafter}: {made.describe()} ({why})")
    return made
