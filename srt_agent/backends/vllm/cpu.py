"""vLLM's CPU settings for this process: the ``VLLM_*`` variables of a CPU engine (:func:`cpu_env`) and the
environment to re-exec with so libiomp5 and tcmalloc are preloaded (:func:`preload_env`).

``LD_PRELOAD`` only works at process start: a CLI does ``env = preload_env(); if env is not None:
os.execve(sys.executable, [sys.executable, *sys.argv], env)`` before anything imports torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PRELOAD_LIBS = ("libiomp5.so", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


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
