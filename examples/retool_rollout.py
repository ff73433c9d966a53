"""ReTool rollouts from Python: load an env config, run it, look at the trajectories.

python examples/retool_rollout.py --model smollm2 --limit 2 --n 2
"""

from __future__ import annotations

import argparse
from pathlib import Path

from srt_agent.agent import build_controller, load_env_config, run_rollouts

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=str(ROOT / "envs" / "retool_arith.yaml"))
    parser.add_argument("--model", default=None, help="overrides the env config's model")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    args = parser.parse_args(argv)

    config = load_env_config(args.env)
    controller = build_controller(config, model=args.model)
    try:
        trajectories, summary = run_rollouts(controller, config.dataset.tasks(args.limit), n_samples=args.n)
    finally:
        controller.engine.close()
    for traj in trajectories:
        calls = ", ".join(f"{call.name}:{call.status}" for call in traj.tool_calls) or "no tool calls"
        print(
            f"task {traj.task_index} sample {traj.sample_index}: reward {traj.reward:+.2f}, "
            f"{traj.num_turns} turns, {traj.model_tokens} model + {len(traj.response_ids) - traj.model_tokens} "
            f"tool tokens, {calls}, {traj.finish_reason}"
        )
    print(
        f"mean reward {summary.mean_reward:.3f}, tokens per forward {summary.tokens_per_forward:.2f}, "
        f"draft acceptance {summary.acceptance:.1%}"
    )


if __name__ == "__main__":
    main()
