"""``engine.dtype``: what rollouts compute in (``auto`` by device), and the engine casting its model to it."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from srt_agent.backends.engine_backend import engine_backend
from srt_agent.config import EngineConfig, EnvConfig
from srt_agent.engine import Engine, EngineOptions
from srt_agent.engine.params import SamplingParams
from srt_agent.models import tiny_random_model
from srt_agent.runner.device_info import ENGINE_DTYPES, resolve_engine_dtype


def test_the_config_offers_the_names_the_engine_resolves():
    assert get_args(EngineConfig.model_fields["dtype"].annotation) == ENGINE_DTYPES
    assert EngineConfig().dtype == "auto"


def test_auto_is_bfloat16_on_a_gpu_that_has_it_and_the_loaded_dtype_on_a_cpu(monkeypatch):
    assert resolve_engine_dtype("auto", "cpu") == torch.float32
    assert resolve_engine_dtype("auto", "cpu", torch.float64) == torch.float64  # the exactness tests' models
    for name in ENGINE_DTYPES[1:]:
        assert resolve_engine_dtype(name, "cpu") == getattr(torch, name)
    # A stand-in for a CUDA machine: these two answers are all `auto` reads of the GPU.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_engine_dtype("auto", "cuda", torch.float32) == torch.bfloat16
    assert resolve_engine_dtype("float32", "cuda") == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_engine_dtype("auto", "cuda:0", torch.float32) == torch.float32
    with pytest.raises(ValueError, match="unknown engine dtype 'half'"):
        resolve_engine_dtype("half", "cpu")


def test_the_engine_casts_its_model_and_keeps_the_rotary_frequencies():
    loaded = tiny_random_model("llama", seed=0, dtype=torch.float32)
    engine = Engine(
        loaded,
        EngineOptions(drafter="none", device="cpu", max_batch=2, max_context=64, calibrate=False, dtype="bfloat16"),
    )
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert engine.runner.kv.keys[0].dtype == torch.bfloat16
    # computed, not loaded: rounded to bfloat16 its angles would drift over a long context
    assert loaded.model.model.rotary_emb.inv_freq.dtype == torch.float32
    (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8, seed=0))
    assert len(out.token_ids) == 8
    # float32 weights from the trainer land in the engine's dtype
    engine.update_weights({k: v.float() for k, v in loaded.model.state_dict().items()})
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_the_engine_keeps_the_loaded_dtype_unless_told():
    loaded = tiny_random_model("llama", seed=0)  # float64
    Engine(loaded, EngineOptions(drafter="none", device="cpu", max_batch=1, max_context=32, calibrate=False))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float64}


def test_the_backend_runs_the_configs_engine_dtype():
    loaded = tiny_random_model("llama", seed=0, dtype=torch.float32)
    config = EnvConfig.model_validate(
        {"engine": {"dtype": "bfloat16", "max_batch": 1, "max_context": 32, "calibrate": False}}
    )
    backend = engine_backend(config, loaded, drafter="none")
    try:
        assert backend.engine.runner.kv.keys[0].dtype == torch.bfloat16
    finally:
        backend.close()
