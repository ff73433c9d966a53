"""Calls into the workers of a started vLLM engine (``llm.collective_rpc``): the live SRT proposer, new
weights in place, and what each worker's model runner is and carries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _drafter(worker):
    return worker.model_runner.drafter


def _call_drafter(worker, name: str, args: tuple, kwargs: dict):
    return getattr(worker.model_runner.drafter, name)(*args, **kwargs)


def srt_proposer(llm):
    """The SRTProposer object of an in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    from .proposer import SRTProposer

    drafter = llm.collective_rpc(_drafter)[0]
    if not isinstance(drafter, SRTProposer):
        raise ValueError(
            f"the engine's proposer is {type(drafter).__name__}, not SRTProposer "
            "(in-process engines only: VLLM_ENABLE_V1_MULTIPROCESSING=0)"
        )
    return drafter


def proposer_call(llm, name: str, *args: Any, **kwargs: Any) -> Any:
    """``drafter.<name>(*args, **kwargs)`` in every worker; the first worker's result."""
    return llm.collective_rpc(_call_drafter, args=(name, args, kwargs))[0]


def _reload(worker, tensors):
    worker.model_runner.reload_weights(weights_iterator=iter(tensors))


def reload_weights(llm, named_tensors: Iterable[tuple[str, Any]]) -> None:
    """Load new weights into the running model (names as in the HF checkpoint); drafts and trees stay."""
    llm.collective_rpc(_reload, args=(list(named_tensors),))


def _runner_report(worker) -> dict:
    """What a worker's model runner is and which of srt-agent's hooks it carries."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .plugin import failed_steps

    runner = worker.model_runner
    kind = type(runner)
    return {
        "runner": f"{kind.__module__}.{kind.__qualname__}",
        "v1": isinstance(runner, GPUModelRunner),
        "exact_sampling": bool(getattr(runner, "srt_exact_sampling", False))
        and getattr(getattr(kind, "_sample", None), "srt_exact", False),
        "seam": getattr(getattr(kind, "propose_draft_token_ids", None), "srt_seam", False),
        "drafter": type(getattr(runner, "drafter", None)).__name__,
        "plugin_failed": dict(failed_steps),
    }


def runner_problems(report: dict, exact_sampling: bool, srt: bool) -> list[str]:
    """What keeps a worker (its `_runner_report`) from running as asked; [] when nothing does."""
    failed = "".join(f" ({step}: {why})" for step, why in report["plugin_failed"].items())
    if not report["v1"]:
        return [
            f"vLLM runs {report['runner']}, not the V1 model runner that calls custom proposers and _sample: set "
            "VLLM_USE_V2_MODEL_RUNNER=0 before the process starts its first vLLM engine"
        ]
    problems = []
    if exact_sampling and not report["exact_sampling"]:
        problems.append(f"exact sampling is not installed in vLLM's model runner (GPUModelRunner._sample){failed}")
    if srt and not report["seam"]:
        problems.append(f"SRT's proposer seam is not installed (GPUModelRunner.propose_draft_token_ids){failed}")
    if srt and report["drafter"] != "SRTProposer":
        problems.append(f"vLLM built {report['drafter']} as its drafter, not SRTProposer")
    return problems


def check_runner(llm, exact_sampling: bool, srt: bool) -> None:
    """Raise RuntimeError (one line) unless every worker of `llm` runs the V1 model runner with exact sampling
    (if asked) and SRT's proposer seam (if `srt`) in place."""
    for report in llm.collective_rpc(_runner_report):
        problems = runner_problems(report, exact_sampling, srt)
        if problems:
            raise RuntimeError("; ".join(problems))
