"""``srt-agent eval``: the held-out evaluation of any env, for the base model or a training checkpoint's policy.

It runs :func:`srt_agent.rl.evaluate.evaluate_policy`, the trainer's own held-out evaluation (same tasks,
same seed, same 95% intervals), so its figures line up with a run's "before RL" / "after RL" reports; it
writes ``report.json``, ``summary.md`` and ``rollouts.jsonl`` to its folder.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Literal

from rich.console import Console

from ..agent.rollout import write_jsonl
from ..config import ConfigError, EnvConfig
from ..config.tasks import Task
from ..console import phase_bar
from ..files.atomic import write_atomic
from .evaluate import HELD_OUT_FIGURES, evaluate_policy, held_out_tasks, interval_text, reports_by_source

TaskSet = Literal["held-out", "dataset"]


def eval_tasks(config: EnvConfig, which: TaskSet = "held-out", n: int | None = None) -> list[Task]:
    """The tasks an evaluation runs: the trainer's held-out set (`n` of them, default ``cold_start.eval_tasks``)
    or the env's dataset (its first `n` tasks: a test file named by ``dataset.source``)."""
    if which == "held-out":
        tasks = held_out_tasks(config, n if n is not None else (config.cold_start.eval_tasks or 12))
    elif which == "dataset":
        tasks = config.dataset.tasks(limit=n)
    else:
        raise ConfigError(f"unknown task set {which!r}; choose held-out or dataset")
    if not tasks:
        raise ConfigError(f"no {which} tasks to evaluate")
    return tasks


def load_policy_weights(config: EnvConfig, loaded, checkpoint: Path) -> tuple[dict, Path]:
    """The engine weights of the policy saved in `checkpoint` (a step folder or a run folder) on `loaded`'s
    model, and the step folder; ValueError/FileNotFoundError naming the folder when it holds no checkpoint
    that fits."""
    from .checkpoint import find_checkpoint, load_checkpoint
    from .policy import build_policy

    folder = find_checkpoint(checkpoint)
    state, _ = load_checkpoint(folder)
    if "policy" not in state:
        raise ValueError(f"checkpoint {folder} holds no policy weights")
    saved = state.get("config") or {}
    try:  # the policy as it was trained (LoRA rank, value head), on this model
        trained = EnvConfig.model_validate({**saved, "model": config.model}) if saved else config
    except ValueError:
        trained = config
    policy = build_policy(trained, loaded.model)[0]
    try:
        policy.load_state_dict(state["policy"])
    except (RuntimeError, KeyError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"checkpoint {folder} does not fit {loaded.name} (trained on {saved.get('model', '?')}?): {first}"
        ) from None
    return policy.engine_weights(), folder


def run_eval(
    config: EnvConfig,
    out_dir: str | Path,
    *,
    checkpoint: str | Path | None = None,
    n: int | None = None,
    n_samples: int = 1,
    tasks: TaskSet = "held-out",
    model: str | None = None,
    loaded=None,
    console: Console | None = None,
) -> dict:
    """Evaluate `config`'s env on its held-out tasks (or its dataset) with the model, or the policy of
    `checkpoint`; writes report.json, summary.md and rollouts.jsonl to `out_dir` and returns the report."""
    from ..agent.toolconfig import load_tools, require_sandbox_runtime
    from ..models import load_model
    from .checkpoint import find_checkpoint
    from .rollouts import PolicyRollouts

    console = console or Console()
    out_dir = Path(out_dir)
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if checkpoint is not None:  # a bad folder fails before the model loads
        if not checkpoint.exists():
            raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
        checkpoint = find_checkpoint(checkpoint)
    task_list = eval_tasks(config, tasks, n)
    tools = load_tools(config.tools, config.interpreter) if config.tools is not None else {}
    require_sandbox_runtime(tools)
    out_dir.mkdir(parents=True, exist_ok=True)
    if loaded is None:
        with console.status(f"loading {model or config.model}"):
            loaded = load_model(model or config.model, device=config.engine.device)
    drafter = config.engine.drafter
    rollouts = PolicyRollouts(config, loaded, tools, [drafter])
    step_folder = None
    try:
        if checkpoint is not None:
            weights, step_folder = load_policy_weights(config, loaded, checkpoint)
            rollouts.update_weights(weights)
        seed = config.cold_start.eval_seed
        phase = functools.partial(phase_bar, console, lines=None)  # a line per trajectory in a log
        report, run = evaluate_policy(
            rollouts, task_list, seed, n_samples=n_samples, phase=phase, label=f"{tasks} tasks"
        )
        backend = rollouts.backend(rollouts.main).name
    finally:
        rollouts.close()
    result = {
        "name": config.name,
        "model": loaded.name,
        "checkpoint": str(step_folder) if step_folder is not None else None,
        "backend": backend,
        "drafter": drafter,
        "tasks": {"set": tasks, "count": len(task_list), "samples_per_task": n_samples, "seed": seed},
        "reward_kind": config.reward.kind,
        "report": report.as_dict(),
        "by_source": {source: r.as_dict() for source, r in reports_by_source(run).items()},
        "config": config.model_dump(mode="json"),
    }
    write_atomic(out_dir / "report.json", json.dumps(result, indent=2))
    write_atomic(out_dir / "summary.md", eval_summary_markdown(result))
    write_jsonl(run.trajectories, out_dir / "rollouts.jsonl")
    for line in eval_lines(result):
        console.print(line, highlight=False)
    console.print(f"wrote {out_dir / 'report.json'}, {out_dir / 'summary.md'}, {out_dir / 'rollouts.jsonl'}")
    return result


def eval_lines(result: dict) -> list[str]:
    """The console's account of an evaluation: what ran, then each figure with its 95% interval."""
    r, t = result["report"], result["tasks"]
    who = f"checkpoint {result['checkpoint']}" if result["checkpoint"] else result["model"]
    return [
        f"{result['name']}: {who}, {t['count']} {t['set']} tasks × {t['samples_per_task']} samples",
        ", ".join(f"{k.replace('_', ' ')} {interval_text(k, r[k], r['intervals'].get(k))}" for k in HELD_OUT_FIGURES)
        + " (95% intervals)",
    ]


def eval_summary_markdown(result: dict) -> str:
    """summary.md of an evaluation: the figures with 95% intervals, overall and per task source."""
    t = result["tasks"]
    who = f"`{result['checkpoint']}`" if result["checkpoint"] else f"`{result['model']}` (no checkpoint)"
    lines = [
        f"# {result['name']}: evaluation of {who}",
        "",
        f"{t['count']} {t['set']} tasks × {t['samples_per_task']} samples (seed {t['seed']}), "
        f"{result['backend']} backend, reward kind `{result['reward_kind']}`. Brackets: 95% intervals "
        "(Wilson for shares, bootstrap for the mean reward).",
        "",
        "| tasks | trajectories | tool calls | code ran cleanly | accuracy | mean reward |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [("all", result["report"])]
    if len(result["by_source"]) > 1:
        rows += list(result["by_source"].items())
    for label, r in rows:
        cells = [
            interval_text(k, r[k], r["intervals"].get(k))
            for k in ("tool_call_rate", "code_ok_rate", "accuracy", "mean_reward")
        ]
        lines.append(f"| {label} | {r['trajectories']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
