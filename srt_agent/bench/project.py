"""`srt-agent bench project RUN`: the trainer's GPU projection (`rl/projection.py`) for any recorded run.

RUN is a run folder of ``srt-agent train`` (its ``traces/``, which every run writes, or else its
``rollouts/step-N.jsonl``: projected without validation, the cost tables being in the traces only), or a
verl ``trainer.rollout_data_dir`` (``N.jsonl`` per step, text that the run's tokenizer turns back into
tokens: each response counts as one generated turn, tool output included, since the dump does not mark it).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..agent.env import ToolCallRecord
from ..agent.trajectory import Trajectory
from ..drafting.trees.keys import prompt_key
from ..rl.projection import ProjectionSettings, project, validate
from ..rl.rollout_trace import RolloutTrace, TracedStep, TracedTrajectory
from .shipped_traces import recorded

VERL_BATCH = 256  # vLLM's max_num_seqs on a GPU: a verl step's rollouts run this many at once


def run_traces(run: str | Path, tokenizer=None, max_batch: int | None = None) -> tuple[dict[str, RolloutTrace], str]:
    """Every variant's trace of the run folder `run` (or the one trace of a trace file, or a shipped trace's
    name) and the name of the training one."""
    run = recorded(run)
    report = json.loads((run / "report.json").read_text()) if (run / "report.json").is_file() else {}
    saved = sorted((run / "traces").glob("*.json"))
    if run.is_file():
        trace = RolloutTrace.load(run)
        traces, main = {trace.variant: trace}, trace.variant
    elif saved:
        traces = {t.variant: t for t in map(RolloutTrace.load, saved)}
        main = report.get("drafter") if report.get("drafter") in traces else next(iter(traces))
    elif sorted((run / "rollouts").glob("step-*.jsonl")):
        main = report.get("drafter", "srt")
        traces = {main: rollouts_trace(run, report, main)}
    elif sorted(run.glob("*.jsonl")):
        if tokenizer is None:
            raise ValueError(f"{run} holds verl's text dumps: pass --tokenizer, the run's model (an HF folder)")
        main = "verl"
        traces = {main: verl_trace(run, tokenizer, max_batch or VERL_BATCH)}
    else:
        raise ValueError(f"{run}: no traces/, rollouts/step-N.jsonl or verl N.jsonl dumps")
    if max_batch:
        for trace in traces.values():
            trace.engine["max_batch"] = max_batch
    return traces, main


def _trace(variant: str, limits: dict, engine: dict) -> RolloutTrace:
    return RolloutTrace(variant, "srt", limits=limits, engine=engine, cache={})


def rollouts_trace(run: Path, report: dict, main: str) -> RolloutTrace:
    """The training variant's trace from ``rollouts/step-N.jsonl`` (no cost tables, tool waits as recorded)."""
    config = report.get("config", {})
    limits = {k: config.get(k, 1 << 20) for k in ("max_tokens_per_turn", "max_response_tokens")}
    engine = {k: v for k, v in config.get("engine", {}).items() if k in ("max_batch", "max_context")}
    trace = _trace(main, limits, engine)
    for index, path in enumerate(sorted((run / "rollouts").glob("step-*.jsonl")), start=1):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        trajectories = [TracedTrajectory.of(trajectory_of(row), row.get("prompt_key") or "") for row in rows]
        trace.steps.append(TracedStep(index, trajectories, {}))
    return trace


def trajectory_of(row: dict) -> Trajectory:
    """A trajectory back from its rollout JSONL row (the fields a trace reads)."""
    traj = Trajectory(row.get("request_id", ""), 0, 0, list(row["prompt_ids"]))
    traj.response_ids, traj.response_mask = list(row["response_ids"]), list(row["response_mask"])
    traj.tool_calls = [ToolCallRecord(**c) for c in row.get("tool_calls", [])]
    traj.forwards, traj.draft_accepted = int(row.get("forwards", 0)), int(row.get("draft_accepted", 0))
    traj.prompt_key = row.get("prompt_key") or prompt_key(traj.prompt_ids)
    return traj


def verl_trace(folder: Path, tokenizer, max_batch: int) -> RolloutTrace:
    """verl's dumps (``N.jsonl``: ``input`` and ``output`` text per rollout) as a trace, one step per file."""
    files = sorted((p for p in folder.glob("*.jsonl") if p.stem.isdigit()), key=lambda p: int(p.stem))
    steps = []
    for path in files:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        trajectories = []
        for row in rows:
            prompt = tokenizer.encode(row["input"], add_special_tokens=False)
            response = tokenizer.encode(row["output"], add_special_tokens=False)
            if response:
                trajectories.append(TracedTrajectory(prompt_key(prompt), prompt, [response], [], []))
        steps.append(TracedStep(int(path.stem), trajectories, {}))
    longest = max((len(t.turns[0]) for s in steps for t in s.trajectories), default=1)
    limits = dict(max_tokens_per_turn=longest, max_response_tokens=longest)
    longest_context = max((len(t.prompt_ids) + len(t.turns[0]) for s in steps for t in s.trajectories), default=2)
    trace = _trace("verl", limits, dict(max_batch=max_batch, max_context=longest_context + 1))
    trace.steps = steps
    return trace


def project_run(run: str | Path, settings: ProjectionSettings, tokenizer=None, max_batch: int | None = None) -> dict:
    """The projection of a recorded run, with the validation where its traces hold measured step costs."""
    traces, main = run_traces(run, tokenizer, max_batch)
    result = project(traces[main], settings)
    result["validation"] = validate(traces)
    result["run"], result["variant"] = str(run), main
    return result
