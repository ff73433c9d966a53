"""A step's training samples: each trajectory's reward (with DAPO's overlong shaping), the samples of its
branches (a server session that branched trains every branch with that reward), and the GRPO groups that
carry a learning signal (DAPO's dynamic sampling keeps only those)."""

from __future__ import annotations

from collections.abc import Sequence

from ..agent.trajectory import Trajectory
from ..config import EnvConfig
from . import algorithms
from .batch import Sample, trajectory_sample
from .rollouts import RolloutRun


def shaped_reward(traj: Trajectory, config: EnvConfig) -> float:
    """The trajectory's reward plus the overlong penalty (zero unless ``train.overlong_buffer`` is set)."""
    train = config.train
    return traj.reward + algorithms.overlong_penalty(
        len(traj.response_ids), config.max_response_tokens, train.overlong_buffer, train.overlong_penalty
    )


def informative_groups(runs: Sequence[RolloutRun], config: EnvConfig) -> set:
    """The (round, task) groups whose rewards differ: those a GRPO update can learn from."""
    rewards, groups = [], []
    for r, run in enumerate(runs):
        for t in run.trajectories:
            if t.finish_reason != "error":
                rewards.append(shaped_reward(t, config))
                groups.append((r, t.task_index))
    return algorithms.informative_groups(rewards, groups)


def rollout_samples(traj: Trajectory, group, rollout, config: EnvConfig) -> list[Sample]:
    """One rollout's samples: its trajectory and, where its session branched, one per earlier branch, all
    with the trajectory's shaped reward; the last with a response leads (see :mod:`srt_agent.rl.batch`)."""
    parts = [t for t in [*traj.branches, traj] if t.response_ids]
    reward = shaped_reward(traj, config)
    samples = []
    for k, part in enumerate(parts):
        sample = trajectory_sample(part, group=group)
        sample.reward, sample.lead = reward, k == len(parts) - 1
        sample.rollout = rollout if len(parts) > 1 else None
        samples.append(sample)
    return samples


def step_samples(runs: Sequence[RolloutRun], config: EnvConfig) -> tuple[list[Sample], int]:
    """Training samples of the step's rollout rounds (errors dropped; with dynamic sampling only informative
    groups, at most a batch of them), and how many groups were dropped."""
    train = config.train
    samples = []
    for r, run in enumerate(runs):
        for t in run.trajectories:
            if t.finish_reason != "error":
                samples += rollout_samples(t, (r, t.task_index), (r, t.task_index, t.sample_index), config)
    groups = list(dict.fromkeys(s.group for s in samples))
    if not train.dynamic_sampling:
        return samples, 0
    informative = informative_groups(runs, config)
    keep = set([g for g in groups if g in informative][: train.prompts_per_step])
    return [s for s in samples if s.group in keep], len(groups) - len(keep)
