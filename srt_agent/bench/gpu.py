"""`srt-agent bench gpu`: the check to run on a CUDA machine, and its CPU dry run.

Four stages, each written to ``OUT/<stage>.json`` when it ends (the long ones also after every run, so a
run cut off by a time limit still leaves data), and ``OUT/summary.json`` (the machine, then each stage's
headline) rewritten after every stage:

* ``exactness`` (`gpu_exactness.py`): the engine's lossless checks on the device;
* ``speed`` (`gpu_speed.py`): the engine in bf16 on random-weight Qwen2.5-shaped models, SRT vs none,
  and what verifying a drafted token costs against a plain step, measured and by the roofline;
* ``train`` (`gpu_train.py`): one GRPO step of the trainer (rollouts, update, weight sync), its memory;
* ``profile`` (`gpu_profile.py`): torch.profiler over one engine step at batch 64.

What the stages share (config, model shapes, random models, the deadline) is in `gpu_setup.py`. Every
stage gets a share of the time budget (what an earlier stage leaves goes to the later ones); a stage
out of time skips what is left and says so, and a stage that raises is recorded with its error while
the next one runs. Models are built from configs with random weights: nothing is downloaded.
"""

from __future__ import annotations

import json
import platform
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..console import Progress
from ..files.atomic import write_atomic
from ..models import resolve_device
from .gpu_exactness import run_exactness
from .gpu_profile import run_profile
from .gpu_setup import SHARES, STAGES, Deadline, GpuCheckConfig, reset_peak_memory
from .gpu_speed import run_speed
from .gpu_train import run_train


def environment(device: torch.device) -> dict:
    """What the check ran on: device, versions, and which token tree the drafters use."""
    import transformers

    from ..drafting.trees.tree import tree_class

    out = dict(
        device=str(device),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        cuda=torch.version.cuda,
        token_tree=tree_class("auto").backend,
        cpu=platform.processor() or platform.machine(),
        torch_threads=torch.get_num_threads(),
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(
            gpu=props.name,
            gpu_memory_gb=props.total_memory / 1e9,
            capability=f"{props.major}.{props.minor}",
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    return out


def write_stage(out: Path, name: str, result: dict) -> None:
    """Write one stage's JSON whole (atomic: a run killed mid-write leaves the previous version)."""
    write_atomic(out / f"{name}.json", json.dumps(result, indent=2, default=str))


Stage = Callable[[GpuCheckConfig, torch.device, Deadline, Callable[[dict], None], Callable[[str], None]], dict]


def stage_functions() -> dict[str, Stage]:
    return {"exactness": run_exactness, "speed": run_speed, "train": run_train, "profile": run_profile}


def run_gpu_check(
    config: GpuCheckConfig, out: Path, log: Callable[[str], None] = lambda line: None, work: Progress | None = None
) -> dict:
    """Run the configured stages, writing each stage's JSON and the summary into `out`; returns the summary.
    `work` hears of each stage as it starts and ends."""
    unknown = [s for s in config.stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; choose from {list(STAGES)}")
    device = resolve_device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device here")
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads or threads)
    try:
        return _run_stages(config, device, out, log, work or Progress.unseen())
    finally:
        torch.set_num_threads(threads)


def _run_stages(config: GpuCheckConfig, device: torch.device, out: Path, log: Callable[[str], None], work) -> dict:
    started = time.monotonic()
    summary = dict(
        status="running",
        config=asdict(replace(config, device=str(device))),
        environment=environment(device),
        stages={},
    )
    write_stage(out, "summary", summary)
    functions = stage_functions()
    end = started + config.budget_s
    for i, name in enumerate(config.stages):
        remaining = sum(SHARES[s] for s in config.stages[i:])
        deadline = Deadline(max(0.0, end - time.monotonic()) * SHARES[name] / remaining)
        log(f"stage {name}: {deadline.left():.0f} s of budget")
        work.now(f"stage {name}")
        result = run_stage(functions[name], name, config, device, deadline, out, log)
        work.done(f"stage {name}: {result['status']} in {result['wall_s']:.0f} s")
        summary["stages"][name] = dict(status=result["status"], wall_s=result["wall_s"], headline=result["headline"])
        write_stage(out, "summary", summary)
    summary["status"] = "done"
    summary["wall_s"] = time.monotonic() - started
    write_stage(out, "summary", summary)
    return summary


def run_stage(
    fn: Stage,
    name: str,
    config: GpuCheckConfig,
    device: torch.device,
    deadline: Deadline,
    out: Path,
    log: Callable[[str], None],
) -> dict:
    """One stage: its partial results are saved as they come; its error (if any) is recorded beside the last
    of them, never raised."""
    t0 = time.monotonic()
    partial: dict = {}

    def save(results: dict) -> None:
        partial.update(json.loads(json.dumps(results, default=str)))  # a copy: the stage goes on changing its own
        write_stage(out, name, dict(stage=name, status="running", wall_s=time.monotonic() - t0, **partial))

    try:
        result = fn(config, device, deadline, save, log)
        status = "skipped-some" if result.get("skipped") else "ok"
    except Exception as exc:  # a stage that fails must not stop the others: recorded, then the next runs
        result = dict(partial, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc(limit=8))
        status = "error"
        log(f"stage {name} failed: {result['error']}")
    finally:
        reset_peak_memory(device)
    result.setdefault("headline", {})
    result = dict(stage=name, status=status, wall_s=time.monotonic() - t0, **result)
    write_stage(out, name, result)
    return result
