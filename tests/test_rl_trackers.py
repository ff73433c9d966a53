"""Experiment trackers: verl's metric names land in real TensorBoard event files and offline W&B runs."""

from __future__ import annotations

import sys

import pytest

from srt_agent.rl.trackers import make_trackers

METRICS = {"actor/pg_loss": 0.25, "critic/score/mean": 0.5, "timing_s/gen": 3.0}


def test_tensorboard_event_files_hold_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tracker,) = make_trackers(["tensorboard"], tmp_path, {}, "run")
    tracker.log(METRICS, step=1)
    tracker.log({k: v * 2 for k, v in METRICS.items()}, step=2)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(METRICS) <= set(events.Tags()["scalars"])
    assert [(e.step, e.value) for e in events.Scalars("critic/score/mean")] == [(1, 0.5), (2, 1.0)]


@pytest.mark.slow
def test_wandb_runs_offline_by_default(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    (tracker,) = make_trackers(["wandb"], tmp_path, {"train": {"lr": 1e-6}}, "run")
    tracker.log(METRICS, step=1)
    tracker.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("*.wandb"))


def test_a_tracker_that_is_not_installed_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if `pip install mlflow` never ran
    with pytest.raises(ValueError, match="needs the 'mlflow' package: pip install mlflow"):
        make_trackers(["tensorboard", "mlflow"], tmp_path, {}, "run")
