"""A run's memory: the KV cache sized from the job, the plan and its refusal line, the peak it reports."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
from helpers.rl_envs import tiny_env_file

from srt_agent.backends.vllm.kv_cache import job_kv_bytes, kv_bytes_per_token, kv_cache_gib
from srt_agent.config import ConfigError, load_env_config
from srt_agent.models import load_tokenizer, tiny_random_model
from srt_agent.rl.memory import (
    GB,
    VLLM_RUNTIME_BYTES,
    MemoryMeter,
    MemoryPlan,
    check_plan,
    memory_line,
    plan_memory,
)
from srt_agent.rl.policy import Policy, build_policy
from srt_agent.rl.trainer import Trainer

# SmolLM2-135M's attention: 30 layers, 9 query heads, 3 KV heads of 64
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)


def test_kv_cache_is_sized_from_batch_and_context():
    assert kv_bytes_per_token(SMOLLM2) == 2 * 30 * 3 * 64 * 4  # K and V, float32
    # the main job: 16 rows × 1024 tokens × 45 KiB = 720 MiB (vLLM's fixed default was 1 GiB)
    assert job_kv_bytes(SMOLLM2, 16, 1024, 32) == 720 * 2**20
    # a context that is not a whole number of blocks takes its last block whole; the total rounds up to 16 MiB
    tiny = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=64)  # no GQA: 4 KV heads of 16
    assert job_kv_bytes(tiny, 4, 100, 32) == 16 * 2**20
    assert job_kv_bytes(SMOLLM2, 16, 1024, None) == job_kv_bytes(SMOLLM2, 16, 1024, 128)


def test_a_kv_size_the_config_sets_wins(tmp_path):
    path = tiny_env_file(tmp_path)
    config = load_env_config(path, ["engine.max_batch=16", "engine.max_context=1024"])
    assert kv_cache_gib(SMOLLM2, config.engine) == 720 / 1024
    config = load_env_config(path, ["engine.vllm.kv_cache_gib=1.5"])
    assert kv_cache_gib(SMOLLM2, config.engine) == 1.5


def test_a_plan_over_the_limit_is_refused_in_one_line():
    plan = MemoryPlan(int(1 * GB), {"vLLM KV cache (2 × 1.00 GiB)": int(2.1 * GB), "AdamW moments": int(1 * GB)})
    check_plan(plan, max_memory_gb=5, available=int(20 * GB))  # 4.1 GB fits
    with pytest.raises(ConfigError) as err:
        check_plan(plan, max_memory_gb=3, available=int(20 * GB))
    line = str(err.value)
    assert "\n" not in line
    assert "about 4.1 GB" in line and "train.max_memory_gb = 3 GB" in line and "vLLM KV cache" in line
    assert "engine.max_batch" in line and "--max-memory" in line
    with pytest.raises(ConfigError, match="2.0 GB this machine has available"):  # the machine's own limit
        check_plan(plan, max_memory_gb=None, available=int(2 * GB))
    check_plan(plan, max_memory_gb=5, available=int(2 * GB))  # the user's limit may exceed what is free now


@pytest.fixture
def tiny():
    return tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"))


def test_the_plan_counts_each_part(tmp_path):
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"), dtype=torch.float32)
    config = load_env_config(tiny_env_file(tmp_path), ["train.kl_coef=0.1"])
    weights = sum(p.numel() for p in tiny.model.parameters()) * 4
    plan = plan_memory(config, tiny.model, vllm_engines=2, policy_copies_model=False, now=0)
    assert plan.parts["gradients"] == plan.parts["reference policy"] == weights
    assert plan.parts["AdamW moments"] == 2 * weights
    assert plan.parts["vLLM weights (2 engines)"] == 2 * weights
    assert "policy (a copy of the model)" not in plan.parts
    assert plan.total == sum(plan.parts.values())
    copied = plan_memory(config, tiny.model, vllm_engines=0, policy_copies_model=True, now=0)
    assert copied.parts["policy (a copy of the model)"] == weights and not any("vLLM" in k for k in copied.parts)
    # our engines preallocate their KV: every slot at full context (plus the draft margin) and the prefix pool
    ours = plan_memory(config, tiny.model, vllm_engines=0, policy_copies_model=True, now=0, our_engines=2)
    (kv_part,) = [k for k in ours.parts if k.startswith("our engine's KV cache (2 ×")]
    e, c = config.engine, tiny.model.config
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    assert ours.parts[kv_part] == 2 * per_token * (e.max_batch * (e.max_context + 17) + e.prefix_cache_tokens)


def test_the_policy_trains_the_module_itself_when_nothing_else_runs_on_it(tmp_path):
    loaded = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"), dtype=torch.float32)
    config = load_env_config(tiny_env_file(tmp_path), ["train.kl_coef=0.1"])
    policy, optimizer, _, reference = build_policy(config, loaded.model, copy=False)
    assert policy.base is loaded.model
    assert reference.base is not loaded.model  # the start policy stays as it was
    assert all(not g.get("foreach") for g in optimizer.param_groups)
    assert Policy(loaded.model).base is not loaded.model  # the default still copies (our engine runs on it)


def test_the_meter_keeps_the_peak():
    with MemoryMeter(interval=0.01) as meter:
        block = torch.ones(50_000_000 // 4)  # 50 MB while it lives
        meter.mark("block")
        del block
    report = meter.report(MemoryPlan(int(1 * GB), {"a": int(0.5 * GB)}), 8)
    assert report["peak_gb"] >= report["at"]["block"] > 0.05
    assert report["plan_gb"]["total"] == 1.5
    assert memory_line(report).startswith(f"peak memory {report['peak_gb']:.1f} GB")
    assert "planned 1.5 GB, limit 8 GB" in memory_line(report)


def test_train_refuses_a_plan_over_max_memory_before_any_engine_starts(tmp_path, tiny, monkeypatch):
    import srt_agent.rl.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "PolicyRollouts", None)  # starting an engine would fail the test
    config = load_env_config(tiny_env_file(tmp_path), ["train.max_memory_gb=0.01"])
    with pytest.raises(ConfigError, match=r"^this run needs about .* more than train.max_memory_gb = 0.01 GB"):
        Trainer(config, tmp_path / "run", loaded=tiny).run()


def test_on_a_gpu_the_plan_counts_the_device_and_refuses_what_it_cannot_hold(tmp_path):
    """A CUDA run's plan, made on this CPU-only machine: ``device`` names where the run computes and
    ``device_free`` is a test double for the memory the GPU can give the process."""
    tiny = tiny_random_model("llama", seed=0, tokenizer=load_tokenizer("smollm2"), dtype=torch.float32)
    config = load_env_config(tiny_env_file(tmp_path), ["train.kl_coef=0.1", "engine.dtype=bfloat16"])
    params = sum(p.numel() for p in tiny.model.parameters())
    plan = plan_memory(
        config, tiny.model, vllm_engines=0, policy_copies_model=True, now=0, our_engines=1, device="cuda:0"
    )
    assert plan.device == "cuda:0" and not plan.parts  # the host keeps the process (`now`) only
    gpu = plan.device_parts
    assert gpu["model (bfloat16)"] == 2 * params  # our engine runs the loaded model, cast to engine.dtype
    assert gpu["policy (a copy of the model)"] == gpu["reference policy"] == gpu["gradients"] == 4 * params
    assert gpu["AdamW moments"] == 8 * params  # float32 moments whatever train.dtype says
    (kv_part,) = [k for k in gpu if k.startswith("our engine's KV cache")]
    e, c = config.engine, tiny.model.config
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 2
    assert gpu[kv_part] == per_token * (e.max_batch * (e.max_context + 17) + e.prefix_cache_tokens)
    assert plan.as_dict()["cuda:0 total"] == round(plan.device_total / GB, 2)
    check_plan(plan, None, available=int(20 * GB), device_free=plan.device_total)  # fits exactly
    with pytest.raises(ConfigError) as err:
        check_plan(plan, None, available=int(20 * GB), device_free=plan.device_total - 1)
    line = str(err.value)
    assert "\n" not in line and " GB on cuda:0 (" in line and "GB it can have there" in line
    assert "AdamW moments" in line and "engine.max_batch" in line
    # vLLM serves its own copy in engine.dtype; the policy trains the loaded float32 model in place
    served = plan_memory(config, tiny.model, vllm_engines=1, policy_copies_model=False, now=0, device="cuda")
    assert served.parts == {"vLLM runtime": VLLM_RUNTIME_BYTES}
    assert served.device_parts["vLLM weights (1 engine)"] == 2 * params
    assert served.device_parts["model (float32)"] == 4 * params
    assert "policy (a copy of the model)" not in served.device_parts


def test_train_refuses_a_gpu_plan_that_does_not_fit_before_any_engine_starts(tmp_path, tiny, monkeypatch):
    import srt_agent.rl.memory as memory
    import srt_agent.rl.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "PolicyRollouts", None)  # starting an engine would fail the test
    # the run plans as on a GPU; the GPU's capacity is a test double (1 MB)
    monkeypatch.setattr(trainer_module, "plan_memory", functools.partial(memory.plan_memory, device="cuda"))
    monkeypatch.setattr(memory, "device_capacity_bytes", lambda device: 10**6)
    with pytest.raises(ConfigError, match=r"^this run needs about .* GB on cuda \(.*more than the 0.0 GB it can have"):
        Trainer(load_env_config(tiny_env_file(tmp_path)), tmp_path / "run", loaded=tiny).run()


def test_the_closing_line_names_the_gpu_peak_beside_its_plan():
    report = {"peak_gb": 1.0, "plan_gb": {"total": 2.0, "cuda:0: gradients": 1.0, "cuda:0 total": 3.0}}
    assert "GPU" not in memory_line(report)  # a CPU run (CUDA never used) has no device peak
    line = memory_line({**report, "device_peak_gb": 2.5})
    assert line.endswith("planned 2.0 GB; GPU peak 2.5 GB, planned 3.0 GB")
