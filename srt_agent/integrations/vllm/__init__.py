"""SRT inside vLLM V1: per-prompt rollout trees as vLLM's speculative proposer, plus what vLLM needs on CPU.

API (``vllm`` is imported lazily, so this module imports without it):

* ``speculative_config(method, num_speculative_tokens, **options)``: the ``speculative_config`` argument of
  ``vllm.LLM`` for ``none`` (None), ``ngram``, ``suffix`` (vLLM's arctic-inference proposer) or ``srt``
  (:class:`~.proposer.SRTProposer`; its options, see ``ProposerOptions``, travel to vLLM's processes in
  the environment variable ``SRT_VLLM_PROPOSER``, which this call sets).
* ``cpu_env(threads, kv_cache_gib, in_process)``: the ``VLLM_*`` settings for a CPU engine; put them in
  ``os.environ`` before ``LLM(...)``. ``preload_env()`` is the environment to re-exec the process with so
  libiomp5 and tcmalloc are preloaded (``LD_PRELOAD`` only works at process start): a CLI does
  ``env = preload_env(); if env is not None: os.execve(sys.executable, [sys.executable, *sys.argv], env)``
  before anything imports torch.
* ``vllm_model_dir(spec)`` (models.py): an HF directory for ``smollm2``, a ``.gguf``, ``tiny-llama``.
* ``srt_proposer(llm)``: the live proposer of an in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
  ``.stats()``, ``.save(path)``, ``.load(path)``, ``.end_step()``, ``.cache`` (the RolloutCache).
  ``proposer_call(llm, name, *args)`` calls one of those methods in every worker (any process layout)
  and returns the first worker's result.
* ``reload_weights(llm, named_tensors)``: new policy weights in place; the trees stay.
* ``check_runner(llm, exact_sampling, srt)``: asks every worker of a started engine whether it runs vLLM's V1
  model runner with what srt-agent hooks installed; raises one line naming what is missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .settings import set_proposer_options

PROPOSER_CLASS = "srt_agent.integrations.vllm.proposer.SRTProposer"
METHODS = ("none", "ngram", "suffix", "srt")
PRELOAD_LIBS = ("libiomp5.so", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")

__all__ = [
    "METHODS",
    "check_runner",
    "cpu_env",
    "preload_env",
    "proposer_call",
    "reload_weights",
    "speculative_config",
    "srt_proposer",
    "tiny_model_dir",
    "vllm_model_dir",
]


def __getattr__(name: str) -> Any:
    """``tiny_model_dir`` and ``vllm_model_dir`` load lazily: they import torch, and the settings do not."""
    if name in ("tiny_model_dir", "vllm_model_dir"):
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def speculative_config(method: str, num_speculative_tokens: int = 8, **options: Any) -> dict | None:
    """vLLM's ``speculative_config`` for `method`; `options` go to the method (ngram: ``prompt_lookup_min``/
    ``max``; suffix: ``suffix_decoding_*``; srt: ``ProposerOptions`` fields)."""
    if method == "none":
        return None
    if method not in METHODS:
        raise ValueError(f"unknown speculative method {method!r}; choose one of {METHODS}")
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(num_speculative_tokens)}
    if method == "ngram":
        config.update({"prompt_lookup_min": 2, "prompt_lookup_max": 4, **options})
    elif method == "suffix":
        config.update(options)
    else:
        set_proposer_options(options)  # bad options fail here, not in vLLM's worker
        config.update({"method": "custom_class", "model": PROPOSER_CLASS})
    return config


def _cpu_list(cpus: list[int]) -> str:
    """``0-3`` for a contiguous range, else ``0,2,5``."""
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
    return ",".join(map(str, cpus))


def cpu_env(threads: int | None = None, kv_cache_gib: int = 2, in_process: bool = True) -> dict[str, str]:
    """vLLM's CPU settings: OpenMP threads bound to the first `threads` CPUs this process may use (all by
    default) with none reserved, the KV cache size, and (``in_process``) engine and worker in this process,
    which :func:`srt_proposer` needs."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cpus = cpus[: threads or len(cpus)]
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": _cpu_list(cpus),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),  # whole GiB
    }
    if in_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def preload_env(environ: dict[str, str] | None = None) -> dict[str, str] | None:
    """The environment to re-exec with so the venv's libiomp5 and tcmalloc are preloaded, or None when
    they already are (or neither exists). Libraries that are missing are left out. Intel OpenMP's warning
    about forking while its threads are up (every sandbox run forks) is switched off."""
    environ = dict(os.environ if environ is None else environ)
    libs = [str(Path(sys.prefix) / "lib" / PRELOAD_LIBS[0]), PRELOAD_LIBS[1]]
    current = [p for p in environ.get("LD_PRELOAD", "").split(":") if p]
    missing = [lib for lib in libs if Path(lib).exists() and lib not in current]
    if not missing:
        return None
    environ["LD_PRELOAD"] = ":".join(current + missing)
    environ.setdefault("KMP_WARNINGS", "0")
    return environ


# ---- the live proposer ---------------------------------------------------------------------------
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
