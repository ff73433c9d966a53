"""The trees' byte budget: sized from the run's batch and length or set by the user, split into shares, and
handed to the drafters that keep trees (by their declared capabilities) in both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from srt_agent.backends.vllm.backend import proposer_options
from srt_agent.config import load_env_config
from srt_agent.drafting import SRTDrafter, drafter_capabilities, make_drafter
from srt_agent.drafting.trees.budget import BYTES_PER_TOKEN, HISTORY_STEPS, MIN_BYTES, tree_budget

ENVS = Path(__file__).resolve().parents[1] / "envs"


def test_a_budget_follows_the_runs_batch_and_length_within_the_hosts_memory():
    small = tree_budget(16, 2048)
    assert small.max_bytes == MIN_BYTES and "16 rollouts" in small.line()
    big = tree_budget(1024, 8192)
    assert big.max_bytes == 1024 * 8192 * BYTES_PER_TOKEN * HISTORY_STEPS
    assert big.global_bytes == 64 * 8192 * BYTES_PER_TOKEN  # what 64 feeders hold at full length
    capped = tree_budget(1024, 8192, available=16 << 30)
    assert capped.max_bytes == 2 << 30 and "capped" in capped.line()
    mine = tree_budget(1024, 8192, max_bytes=256 << 20)
    assert mine.max_bytes == 256 << 20 and mine.global_bytes == (256 << 20) // 8 and "as set" in mine.line()
    with pytest.raises(ValueError, match="positive"):
        tree_budget(4, 100, max_bytes=0)


def test_only_drafters_that_keep_trees_are_sized_and_srt_takes_its_global_share():
    budget = tree_budget(256, 1000, max_bytes=64 << 20)
    assert budget.drafter_options(drafter_capabilities("ngram")) == {}
    assert budget.drafter_options(drafter_capabilities("history")) == {"max_bytes": 64 << 20}
    options = budget.drafter_options(drafter_capabilities("srt"))
    srt = make_drafter("srt", **options)
    assert isinstance(srt, SRTDrafter) and srt.responses.max_bytes == budget.global_bytes
    assert srt.cache.max_bytes + srt.responses.max_bytes + srt.turns.max_bytes == 64 << 20
    make_drafter("history", **budget.drafter_options(drafter_capabilities("history")))


def test_a_run_config_sets_the_budget_of_both_backends():
    config = load_env_config(ENVS / "retool_train.yaml", ["engine.tree_bytes=100000000"])
    assert config.tree_budget().max_bytes == 100_000_000
    assert proposer_options(config, "srt")["max_bytes"] == 100_000_000
    assert "max_bytes" not in proposer_options(config, "ngram")
    mine = load_env_config(ENVS / "retool_train.yaml", ["engine.vllm.proposer={max_bytes: 50000000}"])
    assert proposer_options(mine, "srt") == {"max_bytes": 50_000_000}  # the proposer's own setting wins
    always = load_env_config(ENVS / "retool_train.yaml", ["engine.vllm.proposer.policy=always"])
    assert proposer_options(always, "srt")["policy"] == "always"
    assert proposer_options(always, "suffix") == {}  # SRT's options never reach vLLM's own methods
    default = load_env_config(ENVS / "retool_train.yaml")
    rollouts = default.train.prompts_per_step * default.n_samples
    assert default.tree_budget().source.startswith(f"for {HISTORY_STEPS} steps of {rollouts} rollouts")
