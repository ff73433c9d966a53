"""`srt-agent bench prefix`: multi-turn rollouts with and without prefix sharing, side by side.

For every group size n, the same tasks are rolled out with each drafter, once with prefix sharing off
and once on, in one process with one loaded model (runs interleaved, so load drifts hit both). Reported
per run: prompt tokens computed against the unique prompt tokens (the distinct prefixes of all first-turn
prompts plus every tool output), wall time, CPU time of the process (steadier than wall time on a shared
machine), the engine's forward time, generated tokens per second, and whether the tokens equal
the reference run's (sharing off, first drafter) trajectory for trajectory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..agent.rollout import build_controller, run_rollouts
from ..agent.trajectory import Trajectory
from ..config import EngineConfig, load_env_config, validate_config


@dataclass
class PrefixBenchConfig:
    env_file: Path = Path("envs/retool_arith.yaml")
    model: str | None = None  # default: the env config's
    limit: int = 4
    group_sizes: tuple[int, ...] = (4, 8)
    drafters: tuple[str, ...] = ("none", "srt")
    max_batch: int | None = None  # default: the env config's
    overrides: tuple[str, ...] = ()  # env config keys, as `--set` takes them

    def runs(self) -> int:
        """Rollout runs in all: every (n, drafter, sharing off and on)."""
        return len(self.group_sizes) * len(self.drafters) * 2

    @classmethod
    def quick(cls, env_file: Path = Path("envs/retool_arith.yaml")) -> PrefixBenchConfig:
        """Tiny random model, one task in groups of 2, one short turn: seconds (checks the pipeline)."""
        turn = ("model=tiny-llama", "max_turns=1", "max_tokens_per_turn=8", "max_response_tokens=8")
        return cls(env_file, limit=1, group_sizes=(2,), overrides=turn)


def unique_prompt_tokens(trajectories: Sequence[Trajectory]) -> int:
    """Distinct prefixes of the first-turn prompts (a token trie's size) plus all tool-output tokens."""
    trie: dict = {}
    size = 0
    for traj in trajectories:
        node = trie
        for token in traj.prompt_ids:
            if token not in node:
                node[token] = {}
                size += 1
            node = node[token]
    forced = sum(len(t.response_ids) - t.model_tokens for t in trajectories)
    return size + forced


@dataclass
class PrefixRun:
    n: int
    drafter: str
    sharing: bool
    wall_s: float
    cpu_s: float  # this process's CPU time (all its threads): steadier than wall time on a shared machine
    forward_s: float  # the engine's forward passes, LM head and sampling
    draft_s: float
    model_tokens: int
    tokens_per_s: float
    prefill_computed: int
    prefill_reused: int
    prefill_hit_rate: float
    unique_prompt_tokens: int
    computed_over_unique: float
    forwards: int
    tokens_per_forward: float
    mean_reward: float
    identical_to_reference: bool
    prefix_blocks_in_use: int | None = None
    engine_stats: dict = field(default_factory=dict)


def run_prefix_bench(config: PrefixBenchConfig, report: Callable[[PrefixRun], None] | None = None) -> dict:
    """Every (n, drafter, sharing) rollout; ratios per n: sharing on vs off, SRT vs none."""
    from ..models import load_model

    env = load_env_config(config.env_file, list(config.overrides))
    tasks = env.dataset.tasks(config.limit)
    loaded = load_model(config.model or env.model, device=env.engine.device)
    runs: list[PrefixRun] = []
    for n in config.group_sizes:
        reference: list[list[int]] | None = None
        for drafter in config.drafters:
            for sharing in (False, True):
                overrides = {**env.engine.model_dump(), "drafter": drafter, "prefix_sharing": sharing}
                if config.max_batch is not None:
                    overrides["max_batch"] = config.max_batch
                env.engine = validate_config(EngineConfig, overrides, "bench prefix")
                controller = build_controller(env, loaded=loaded)
                try:
                    cpu = time.process_time()
                    trajectories, summary = run_rollouts(controller, tasks, n)
                    cpu_s = time.process_time() - cpu
                    stats = controller.engine.call(lambda engine: engine.stats()).result()
                finally:
                    controller.engine.close()
                tokens = [t.response_ids for t in trajectories]
                reference = tokens if reference is None else reference
                unique = unique_prompt_tokens(trajectories)
                run = PrefixRun(
                    n=n,
                    drafter=drafter,
                    sharing=sharing,
                    wall_s=summary.wall_s,
                    cpu_s=cpu_s,
                    forward_s=stats["forward_s"],
                    draft_s=stats["draft_s"],
                    model_tokens=summary.model_tokens,
                    tokens_per_s=summary.model_tokens / summary.wall_s,
                    prefill_computed=summary.prefill_computed,
                    prefill_reused=summary.prefill_reused,
                    prefill_hit_rate=summary.prefill_hit_rate,
                    unique_prompt_tokens=unique,
                    computed_over_unique=summary.prefill_computed / unique,
                    forwards=stats["forwards"],
                    tokens_per_forward=stats["tokens_per_forward"],
                    mean_reward=summary.mean_reward,
                    identical_to_reference=tokens == reference,
                    prefix_blocks_in_use=summary.prefix_blocks_in_use,
                    engine_stats={k: v for k, v in stats.items() if k.startswith(("prefill", "prefix"))},
                )
                runs.append(run)
                if report is not None:
                    report(run)
    return {
        "config": {**asdict(config), "env_file": str(config.env_file)},
        "tasks": len(tasks),
        "runs": [asdict(r) for r in runs],
        "ratios": ratios(runs),
    }


def ratios(runs: list[PrefixRun]) -> list[dict]:
    """Per n and drafter: sharing on / off (wall speed-up, tokens/s); per n and sharing: SRT / none tokens/s."""
    by = {(r.n, r.drafter, r.sharing): r for r in runs}
    out = []
    for (n, drafter, sharing), run in by.items():
        row = {"n": n, "drafter": drafter, "sharing": sharing}
        off = by.get((n, drafter, False))
        if sharing and off is not None:
            row["wall_speedup_from_sharing"] = off.wall_s / run.wall_s
            row["cpu_speedup_from_sharing"] = off.cpu_s / run.cpu_s
            row["forward_speedup_from_sharing"] = off.forward_s / run.forward_s
            row["prefill_computed_off_over_on"] = off.prefill_computed / max(run.prefill_computed, 1)
        none = by.get((n, "none", sharing))
        if drafter != "none" and none is not None:
            row["tokens_per_s_over_none"] = run.tokens_per_s / none.tokens_per_s
            row["cpu_s_none_over_this"] = none.cpu_s / run.cpu_s
        out.append(row)
    return out


def result_table(result: dict):
    """The runs as a rich table."""
    from rich.table import Table

    table = Table(
        "n",
        "drafter",
        "sharing",
        "prefill computed",
        "unique",
        "computed/unique",
        "hit rate",
        "wall s",
        "cpu s",
        "forward s",
        "tokens/s",
        "tokens/step",
        "same tokens",
        title=f"prefix sharing: {result['tasks']} tasks",
    )
    for r in result["runs"]:
        table.add_row(
            str(r["n"]),
            r["drafter"],
            "on" if r["sharing"] else "off",
            str(r["prefill_computed"]),
            str(r["unique_prompt_tokens"]),
            f"{r['computed_over_unique']:.2f}",
            f"{r['prefill_hit_rate']:.1%}",
            f"{r['wall_s']:.1f}",
            f"{r['cpu_s']:.1f}",
            f"{r['forward_s']:.1f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['tokens_per_forward']:.2f}",
            "yes" if r["identical_to_reference"] else "NO",
        )
    return table
