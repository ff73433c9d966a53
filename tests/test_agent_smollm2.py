"""The ReTool loop end to end with the real SmolLM2-135M and the real bubblewrap sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from srt_agent.agent import build_controller, load_env_config, run_rollouts

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_retool_arith_with_smollm2(smollm2):
    config = load_env_config(ROOT / "envs" / "retool_arith.yaml")
    config.max_turns, config.max_tokens_per_turn, config.max_response_tokens = 2, 96, 320
    config.sampling.temperature = 0.7
    tasks = config.dataset.tasks(limit=2)
    controller = build_controller(config, loaded=smollm2)
    try:
        trajectories, summary = run_rollouts(controller, tasks, n_samples=2)
    finally:
        controller.engine.close()
    assert len(trajectories) == 4 and summary.forwards > 0
    for traj in trajectories:
        assert traj.error is None and traj.finish_reason in ("done", "max_turns", "length")
        assert 1 <= traj.num_turns <= 2 and traj.model_tokens > 0
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.response_logprobs)
    ran = [(traj, call) for traj in trajectories for call in traj.tool_calls if call.status == "ok"]
    assert ran, "SmolLM2 wrote no runnable code block in any of the 4 trajectories"
    traj, call = ran[0]
    forced = [t for t, m in zip(traj.response_ids, traj.response_mask) if m == 0]
    assert "<interpreter>" in smollm2.tokenizer.decode(forced) and call.output.strip() in smollm2.tokenizer.decode(
        forced
    )
    assert traj.num_turns == 2
    assert summary.tool_calls >= 1 and summary.tool_wait_s > 0
