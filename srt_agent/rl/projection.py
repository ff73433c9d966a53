"""What SRT buys on the GPUs users own, projected from a run's own rollouts, and checked on this machine.

Speculation is lossless, so a run's rollouts are what every method would have sampled: the replay
(`rl/replay.py`) reruns them through plain decoding (``none``), SRT (with run-ahead where the run recorded
it) and SuffixDecoding on a device's clock (`rl/roofline_cost.py`: the model shape's bytes and FLOPs per
step against the device's bandwidth and peak, a fixed cost per step, the drafter's measured host time per
row). The same replay on this machine's own measured step costs predicts the generation time the run
measured for each recorded variant and step: its relative errors are the projection's validation.
What it assumes and cannot know: docs/benchmarks/projection.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..drafting import drafter_capabilities
from .replay import ReplayedStep, ReplayOptions, TableCost, replay
from .rollout_trace import RolloutTrace, TracedStep, cost_model_of
from .roofline_cost import FIXED_S, GPU, RooflineCost, device, load_model_config

VALIDATION_TARGET = 0.15  # the largest relative error of a validated step's predicted generation time
PROJECTED_METHODS = ("none", "srt", "srt+run-ahead", "suffix")  # "srt+run-ahead" only where the run recorded run-ahead
DRAFTING = ("srt", "srt+run-ahead", "suffix")  # the methods that pay the drafter's host time per row


@dataclass
class ProjectionSettings:
    """The device and model shape to project onto; `host_us_per_row` None takes the run's measured figure."""

    device: str | GPU = "H100"  # a name in the device table, or a device of one's own
    model: str | Path | None = None  # a config.json (default: Qwen2.5-1.5B's)
    fixed_ms: float = FIXED_S * 1e3
    host_us_per_row: float | None = None
    overlap_host: bool = False


def host_s_per_row(trace: RolloutTrace) -> float | None:
    """The drafter's measured host seconds per row and step over the trace (None where none were counted)."""
    rows = sum(s.forwards for s in trace.steps)
    drafted = sum(s.draft_s for s in trace.steps)
    return drafted / rows if rows and drafted > 0 else None


def generated(step: TracedStep) -> int:
    return sum(len(turn) for t in step.trajectories for turn in t.turns)


def _figures(trace: RolloutTrace, steps: list[ReplayedStep]) -> dict:
    tokens = sum(generated(s) for s in trace.steps)
    forwards = sum(s.forwards for s in steps)
    return dict(
        gen_s=sum(s.simulated_s for s in steps),
        decode_s=sum(s.busy_s for s in steps),
        tokens_per_forward=tokens / forwards if forwards else 0.0,
        steps=[dict(step=s.step, gen_s=s.simulated_s, decode_s=s.busy_s, forwards=s.forwards) for s in steps],
    )


def project(trace: RolloutTrace, settings: ProjectionSettings | None = None) -> dict:
    """Every method's projected generation time and tokens per forward on the settings' device, from the
    rollouts of `trace` (the training variant's)."""
    settings = settings or ProjectionSettings()
    gpu = settings.device if isinstance(settings.device, GPU) else device(settings.device)
    name, shape = load_model_config(settings.model)
    measured = host_s_per_row(trace)
    host = settings.host_us_per_row * 1e-6 if settings.host_us_per_row is not None else measured or 0.0
    plain = replace(trace, run_ahead=None)
    ahead = trace.run_ahead is not None and drafter_capabilities(trace.drafter).run_ahead
    runs = {"none": (plain, "none"), "srt": (plain, "srt"), "suffix": (plain, "suffix")}
    if ahead:
        runs["srt+run-ahead"] = (trace, "srt")
    methods = {}
    for method in (m for m in PROJECTED_METHODS if m in runs):
        source, drafter = runs[method]
        row_s = host if method in DRAFTING else 0.0

        def clock(step: TracedStep, row_s: float = row_s) -> RooflineCost:
            return RooflineCost(gpu, shape, settings.fixed_ms / 1e3, row_s, settings.overlap_host)

        methods[method] = _figures(trace, replay(source, ReplayOptions(drafter=drafter), costs=clock))
    return dict(
        device=dict(name=gpu.name, bandwidth_gb_s=gpu.bandwidth_gb_s, bf16_tflops=gpu.bf16_tflops),
        model=dict(
            name=name, weight_bytes=shape.layer_bytes + shape.head_bytes, kv_bytes_per_token=shape.kv_bytes_per_token
        ),
        fixed_ms=settings.fixed_ms,
        host_us_per_row=host * 1e6,
        host_measured=settings.host_us_per_row is None and measured is not None,
        overlap_host=settings.overlap_host,
        methods=methods,
    )


def measured_table(step: TracedStep) -> dict | None:
    """The step's cost table as the step left it (its own steps measured in), else as it began; None where neither
    holds a measured shape."""
    return next((t for t in (step.cost_after, step.cost) if t.get("shapes")), None)


def validate(traces: dict[str, RolloutTrace]) -> dict:
    """Each recorded variant replayed as it ran, on this machine's recorded step costs plus its measured host time
    per row: predicted against measured generation time for every step whose cost table holds measured steps
    (a backend that records none, or an engine not calibrated before its first step, leaves steps out)."""
    out: dict = {"target": VALIDATION_TARGET, "variants": {}, "skipped": {}}
    for name, trace in traces.items():
        if not any(measured_table(s) for s in trace.steps):
            out["skipped"][name] = "its backend recorded no measured step-cost table"
            continue

        def clock(step: TracedStep) -> TableCost:
            rows = step.forwards
            host = (step.draft_s + step.bookkeeping_s) / rows if rows else 0.0
            return TableCost(cost_model_of(measured_table(step) or step.cost), host)

        rows = []
        for s, recorded in zip(replay(trace, costs=clock), trace.steps):
            if measured_table(recorded) is None or recorded.wall_s <= 0:
                continue
            error = abs(s.simulated_s - recorded.wall_s) / recorded.wall_s
            rows.append(dict(step=s.step, predicted_s=s.simulated_s, measured_s=recorded.wall_s, error=error))
            if recorded.engine_s > 0:  # where the error lies: in the steps' time, or outside the steps
                rows[-1].update(predicted_steps_s=s.busy_s, measured_steps_s=recorded.engine_s)
        out["variants"][name] = dict(steps=rows, max_error=max((r["error"] for r in rows), default=0.0))
    errors = [v["max_error"] for v in out["variants"].values()]
    out["max_error"] = max(errors) if errors else None
    return out


def projection_lines(projection: dict) -> list[str]:
    """The projection in a line (`projected on H100 (Qwen2.5-1.5B shape): none X s, srt Y s (Z x), suffix W s`) and
    its validation in another; the reason where the projection failed."""
    if "error" in projection:
        return [f"projection failed: {projection['error']}"]
    m = projection["methods"]

    def parts(key: str, methods: tuple[str, ...]) -> str:
        none = m["none"][key]
        return ", ".join(
            f"{k} {m[k][key]:.1f} s" + (f" ({none / m[k][key]:.2f}x)" if k.startswith("srt") and m[k][key] > 0 else "")
            for k in methods
            if k in m
        )

    lines = [
        f"projected on {projection['device']['name']} ({projection['model']['name']} shape): {parts('decode_s', PROJECTED_METHODS)}"
        f" decoding; with this run's tool waits {parts('gen_s', ('none', 'srt'))}"
    ]
    v = projection.get("validation") or {}
    if v.get("max_error") is not None:
        per = ", ".join(f"{name} {fig['max_error']:.0%}" for name, fig in v["variants"].items())
        lines.append(
            f"projection's replay on this machine's step costs: largest error {v['max_error']:.0%} "
            f"(target {v['target']:.0%}; {per})"
        )
    elif v.get("skipped"):
        lines.append("projection not validated: " + "; ".join(f"{k}: {why}" for k, why in v["skipped"].items()))
    return lines


def run_projection(traces: dict[str, RolloutTrace], main: str, settings: ProjectionSettings | None = None) -> dict:
    """The projection of the training variant `main`'s rollouts with the validation of every variant: never
    raises (an ``error`` says why it could not be made)."""
    try:
        if main not in traces or not traces[main].steps:
            raise ValueError("the run recorded no rollouts")
        out = project(traces[main], settings)
        out["validation"] = validate(traces)
        return out
    except Exception as exc:  # noqa: BLE001 - a projection never fails the run that asked for it
        return {"error": f"{type(exc).__name__}: {exc}"}
