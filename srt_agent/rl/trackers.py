"""Experiment trackers: TensorBoard event files under the run's folder, W&B and MLflow when installed.

Metrics keep verl's names (``actor/pg_loss``, ``critic/score/mean``, ``timing_s/gen``, …) so dashboards
built for verl runs carry over. W&B defaults to offline mode and MLflow to a file store inside the
run's folder, so nothing needs a network unless the environment says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    def __init__(self, out_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, out_dir: Path, config: dict, name: str):
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "srt-agent"), name=name, dir=str(out_dir), config=config
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, out_dir: Path, config: dict, name: str):
        import mlflow

        if "MLFLOW_TRACKING_URI" not in os.environ:
            mlflow.set_tracking_uri((Path(out_dir) / "mlruns").resolve().as_uri())
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=name)
        mlflow.log_params({k: str(v)[:250] for k, v in _flatten(config).items()})

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics({k.replace("@", "_"): v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def make_trackers(names: Sequence[str], out_dir: Path, config: dict, run_name: str) -> list[Tracker]:
    """Start the named trackers; a missing package is a clear error naming what to install."""
    trackers: list[Tracker] = []
    try:
        for name in names:
            try:
                if name == "tensorboard":
                    trackers.append(TensorBoardTracker(out_dir))
                elif name == "wandb":
                    trackers.append(WandbTracker(out_dir, config, run_name))
                elif name == "mlflow":
                    trackers.append(MlflowTracker(out_dir, config, run_name))
                else:
                    raise ValueError(f"unknown tracker {name!r}; choose from {sorted(PACKAGES)}")
            except ImportError:
                raise ValueError(
                    f"tracker {name!r} needs the {PACKAGES[name]!r} package: pip install {PACKAGES[name]}"
                ) from None
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    return trackers
