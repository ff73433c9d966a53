"""vLLM as a rollout backend, with SRT as vLLM V1's speculative proposer: everything srt-agent does with vLLM.

One concept a module (``vllm`` itself is imported lazily, so every module here imports without it):

* ``backend.py``: :class:`VLLMBackend` (the RolloutBackend over the engine adapter), ``UndraftedView`` (a run
  without speculation on an SRT engine), ``vllm_backend`` (one from an env config) and the registry entry.
* ``vllm_engine.py``: :class:`VLLMEngine`, vLLM V1's ``LLMEngine`` in this process behind our engine's stepping
  interface (token ids in, our stop rule, exact sampling).
* ``availability.py``: whether vLLM can serve a run here (``vllm_missing``, ``refusal``).
* ``speculative.py``: ``configure_speculation(drafter, n, **options)``, the ``speculative_config`` argument of
  ``vllm.LLM`` for a drafter the registry (``srt_agent.drafting.registry``) says vLLM runs: ``none`` (None),
  ``ngram``, ``suffix`` (vLLM's arctic-inference proposer) or ``srt`` (:class:`~.proposer.SRTProposer`; its
  options, ``ProposerOptions``, travel to vLLM's processes in ``SRT_VLLM_PROPOSER``, which this sets).
* ``proposer_options.py``: ``ProposerOptions``, the SRT proposer's knobs (``engine.vllm.proposer``).
* ``proposer.py``: :class:`~.proposer.SRTProposer`, SRT's drafter (``srt_agent.drafting``) as vLLM's proposer.
* ``plugin.py``: the vLLM plugin (entry point ``vllm.general_plugins: srt``): the proposer's seam, exact
  sampling and the CPU temperature fix, installed in every vLLM process.
* ``exact_sampling.py``: our engine's sampler inside vLLM's model runner.
* ``seams.py``: every name in vLLM srt-agent hooks or calls, declared once, and the checks of them.
* ``settings.py``: the environment variables that carry srt-agent's settings to vLLM's processes.
* ``kv_cache.py``: the KV cache an engine is given.
* ``device_settings.py``: what an engine starts with on this device (``vllm_settings(facts, ...)``, pure: dtype,
  the GPU share or the CPU's threads and KV size; ``device_facts(model_dir)`` reads the device).
* ``cpu.py``: ``cpu_env(threads, kv_cache_gib, in_process)``, the ``VLLM_*`` settings of a CPU engine, and
  ``preload_env()``, the environment to re-exec with so libiomp5 and tcmalloc are preloaded.
* ``run_ahead.py``: :class:`VLLMRunAhead`, run-ahead inside vLLM: extra requests for prompts that come soon
  fill the batch cap's idle slots and the waits for tools; their tokens reach SRT's trees only.
* ``workers.py``: calls into a started engine's workers: ``srt_proposer(llm)`` (the live proposer of an
  in-process engine: ``.stats()``, ``.save(path)``, ``.load(path)``, ``.end_step()``, ``.cache``),
  ``proposer_call(llm, name, *args)`` (any process layout; the first worker's result),
  ``reload_weights(llm, named_tensors)`` (the trees stay) and ``check_runner(llm, exact_sampling, srt)``.
* ``models.py``: ``vllm_model_dir(spec)`` (an HF directory for ``smollm2``, a ``.gguf``, ``tiny-llama``),
  ``tiny_model_dir()``, and what vLLM cannot serve.
"""

from __future__ import annotations

from typing import Any

from .availability import INSTALL_HINT, VLLMUnavailable, VLLMUnsupported, vllm_missing, vllm_version
from .cpu import PRELOAD_LIBS, cpu_env, preload_env
from .speculative import PROPOSER_CLASS, check_drafter, configure_speculation
from .workers import check_runner, proposer_call, reload_weights, srt_proposer

__all__ = [
    "INSTALL_HINT",
    "PRELOAD_LIBS",
    "PROPOSER_CLASS",
    "VLLMUnavailable",
    "VLLMUnsupported",
    "check_drafter",
    "check_runner",
    "cpu_env",
    "preload_env",
    "proposer_call",
    "reload_weights",
    "configure_speculation",
    "srt_proposer",
    "tiny_model_dir",
    "vllm_missing",
    "vllm_model_dir",
    "vllm_version",
]


def __getattr__(name: str) -> Any:
    """``tiny_model_dir`` and ``vllm_model_dir`` load lazily, with the model loaders they import."""
    if name in ("tiny_model_dir", "vllm_model_dir"):
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
