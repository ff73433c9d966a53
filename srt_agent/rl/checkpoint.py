"""Checkpoints of an RL run, written atomically: a step's folder appears whole or not at all; the run
folder that holds them (a new run never takes another's); Ctrl-C held while a checkpoint is written.

``OUT/checkpoints/step-000004/`` holds ``state.pt`` (policy, optimizer, scheduler, RNG states, data
cursor, metrics history) and one ``rollout_cache-<drafter>.npz`` per drafter that keeps trees;
``OUT/checkpoints/latest`` names the newest complete one.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..drafting import RolloutCache
from ..files.atomic import atomic_folder, write_atomic

STATE_FILE = "state.pt"
LATEST = "latest"


def rng_state() -> dict:
    """Every RNG a run draws from: Python's, numpy's, torch's CPU one and, once CUDA is in use, each GPU's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    out_dir: Path, step: int, state: dict, caches: dict[str, RolloutCache], keep: int = 1, rng: dict | None = None
) -> Path:
    """Write step `step`'s checkpoint under ``out_dir/checkpoints``; keep the newest `keep`. `rng` is the
    RNG state to store (default: the current one)."""
    root = Path(out_dir) / "checkpoints"
    target = root / f"step-{step:06d}"
    with atomic_folder(target, fsync=True) as tmp:
        torch.save({**state, "step": step, "rng": rng if rng is not None else rng_state()}, tmp / STATE_FILE)
        for name, cache in caches.items():
            cache.save(tmp / f"rollout_cache-{name}.npz")
    write_atomic(root / LATEST, target.name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def find_checkpoint(path: Path) -> Path:
    """The checkpoint folder `path` names: a step folder, a ``checkpoints`` folder or a run's out dir."""
    path = Path(path)
    if (path / STATE_FILE).is_file():
        return path
    for root in (path / "checkpoints", path):
        latest = root / LATEST
        if latest.is_file():
            folder = root / latest.read_text().strip()
            if (folder / STATE_FILE).is_file():
                return folder
    raise FileNotFoundError(f"no checkpoint in {path} (expected {STATE_FILE}, or checkpoints/{LATEST})")


def run_folder(path: Path) -> Path:
    """The run folder (``OUT``) of the checkpoint `path` names: a run folder, its ``checkpoints`` folder
    or one of its step folders."""
    folder = find_checkpoint(path)
    if folder.parent.name != "checkpoints":
        raise ValueError(
            f"{folder} is not inside a run's checkpoints/ folder; name the run folder to continue in with --out"
        )
    return folder.parent.parent


def holds_run(out_dir: Path) -> bool:
    """Whether `out_dir` already holds (part of) an RL run: checkpoints, rollouts or a report."""
    out_dir = Path(out_dir)
    return any((out_dir / name).exists() for name in ("checkpoints", "rollouts", "report.json"))


def fresh_run_folder(base: Path) -> Path:
    """`base` when it holds no run, else the first of ``base-2``, ``base-3``, … that holds none."""
    base, n = Path(base), 2
    candidate = base
    while holds_run(candidate):
        candidate, n = base.with_name(f"{base.name}-{n}"), n + 1
    return candidate


def load_checkpoint(path: Path) -> tuple[dict, dict[str, Path]]:
    """The state of the checkpoint `path` names, and its saved caches by drafter name."""
    folder = find_checkpoint(path)
    try:
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same problem to the user
        raise ValueError(f"checkpoint {folder} is unreadable: {type(exc).__name__}: {exc}") from None
    caches = {p.stem.removeprefix("rollout_cache-"): p for p in folder.glob("rollout_cache-*.npz")}
    return state, caches


@dataclass
class SavedStep:
    """A finished step's trees and RNG state, kept until its checkpoint is written (or an interrupt
    writes it: the interrupted step's rollouts have changed both since)."""

    step: int
    rng: dict
    trees: dict[str, bytes]

    @classmethod
    def now(cls, step: int, caches: dict[str, RolloutCache]) -> SavedStep:
        return cls(step, rng_state(), {name: cache.to_bytes() for name, cache in caches.items()})

    def caches(self) -> dict[str, RolloutCache]:
        return {name: RolloutCache.from_bytes(data) for name, data in self.trees.items()}


def claim_out_dir(out_dir: Path, resume: Path | None, replace_run: bool) -> None:
    """Make `out_dir` this run's folder and prove it writable, or raise ConfigError before any work starts.

    A folder holding another run is refused (resuming continues its own run); with `replace_run` the
    other run's checkpoints, rollouts and report are removed first."""
    from ..config import ConfigError

    if holds_run(out_dir):
        if replace_run:
            for name in ("checkpoints", "rollouts"):
                shutil.rmtree(out_dir / name, ignore_errors=True)
            (out_dir / "report.json").unlink(missing_ok=True)
        elif resume is None or run_folder(resume).resolve() != out_dir.resolve():
            raise ConfigError(
                f"{out_dir} already holds a run: continue it with --resume {out_dir}, "
                "or start a new one in another folder with --out"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output directory {out_dir} is not writable: {exc.strerror or exc}") from None
