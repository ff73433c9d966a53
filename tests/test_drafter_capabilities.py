"""Callers ask a drafter what it can do, not what it is called: a tree drafter registered under a new name gets
every SRT feature its capabilities allow (trees and their budget in our engine, run-ahead and the undrafted view
inside vLLM, the proposer built around it); a drafter that declares less gets less."""

from __future__ import annotations

from pathlib import Path

import pytest

from srt_agent.backends.engine_backend import engine_backend
from srt_agent.backends.vllm.availability import refusal, vllm_missing
from srt_agent.backends.vllm.proposer import SRTProposer
from srt_agent.backends.vllm.proposer_options import ProposerOptions
from srt_agent.config import load_env_config
from srt_agent.drafting import DRAFTERS, DrafterCapabilities, SRTDrafter, drafter_capabilities, runs_as_proposer
from srt_agent.drafting.registry import DrafterEntry
from srt_agent.rl.rollouts import RolloutVariant, undrafted_owner

ENVS = Path(__file__).resolve().parents[1] / "envs"


class MyTrees(SRTDrafter):
    """SRT under another name: a new tree drafter built like it."""

    name = "mytrees"


class MyTreesWithoutRunAhead(SRTDrafter):
    name = "mytrees-lite"
    capabilities = DrafterCapabilities(trees=True, global_tree=True)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(DRAFTERS, "mytrees", DrafterEntry(f"{__name__}:MyTrees", vllm_method="custom_class"))
    monkeypatch.setitem(
        DRAFTERS, "mytrees-lite", DrafterEntry(f"{__name__}:MyTreesWithoutRunAhead", vllm_method="custom_class")
    )


def test_a_new_tree_drafter_gets_the_trees_their_budget_and_srts_proposer(registered, tiny_llama):
    config = load_env_config(ENVS / "retool_train.yaml", ["engine.tree_bytes=50000000"])
    assert runs_as_proposer("mytrees") and not runs_as_proposer("ngram")
    options = config.tree_budget().drafter_options(drafter_capabilities("mytrees"))
    assert options == {"max_bytes": 50_000_000, "global_bytes": config.tree_budget().global_bytes}
    backend = engine_backend(
        config.model_copy(update={"engine": config.engine.model_copy(update={"max_batch": 2})}),
        tiny_llama,
        drafter="mytrees",
    )
    try:
        assert backend.capabilities.trees and backend.trees() is backend.engine.drafter.cache
        assert isinstance(backend.engine.drafter, MyTrees) and backend.trees().max_bytes < 50_000_000
    finally:
        backend.close()
    proposer = SRTProposer(options=ProposerOptions(drafter="mytrees"))
    assert isinstance(proposer.srt, MyTrees) and proposer.srt.chain  # vLLM verifies chains


def test_vllm_features_follow_what_the_drafter_declares(registered):
    config = load_env_config(ENVS / "retool_train.yaml")
    variants = [RolloutVariant("mytrees", "mytrees"), RolloutVariant("none", "none")]
    assert undrafted_owner(config, variants, 1) == 0  # the comparison runs on the tree drafter's vLLM engine
    assert undrafted_owner(config, [RolloutVariant("ngram", "ngram"), RolloutVariant("none", "none")], 1) is None
    if vllm_missing():
        pytest.skip(f"vLLM is not installed: {vllm_missing()}")
    assert refusal("mytrees", run_ahead=True) is None
    lite = refusal("mytrees-lite", run_ahead=True)
    assert lite is not None and "run-ahead" in str(lite.error)
    assert refusal("ngram", run_ahead=True) is not None


def test_the_benchmarks_take_a_new_drafter_from_the_registry(registered):
    from srt_agent.bench.cache import available_drafters
    from srt_agent.bench.engine import EngineBenchConfig
    from srt_agent.drafting import exact_drafters

    assert "mytrees" in EngineBenchConfig.everything().methods and "mytrees" in available_drafters()  # --all
    assert "spec-rl" not in exact_drafters()  # lenient: not exactly on-policy
    assert "none" not in available_drafters() and "self" not in available_drafters()  # nothing to draft; a model
