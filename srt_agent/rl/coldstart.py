"""ReTool's cold start: SFT on code-integrated traces, with the tool-use report before and after.

The traces, the cold-started weights and the report are cached under the user cache directory by a
hash of the model, the traces' settings and the SFT settings, so a second run goes straight to RL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..agent.toolconfig import require_sandbox_runtime
from ..agent.trajectory import Trajectory
from ..config import EnvConfig
from ..console import Phase, no_bar
from ..files.atomic import atomic_folder, write_atomic
from ..models import LoadedModel, cache_root
from ..sources.arithmetic import arithmetic_tasks
from .batch import Sample, trajectory_sample
from .evaluate import ToolUseReport
from .policy import FLOAT32_SAMPLER, Policy, SamplerNumerics
from .sft import sft_epochs
from .traces import load_message_traces, procedural_traces, turn_end_token

#: 3: a narrow compute dtype computes as the engine does (masters taken before the engine's cast, float32 residual
#: stream and head); 2: ``train.dtype: bfloat16`` trains under autocast over float32 weights (1 kept bfloat16
#: weights, whose updates rounded away: its bfloat16 cold starts taught nothing and must not be reused)
COLD_START_VERSION = 3


class ColdStartError(RuntimeError):
    """The cold start cannot produce training data (e.g. no trace's code ran to the right answer)."""


Evaluator = Callable[[str], ToolUseReport]  # runs the held-out tasks with the current engine weights


@dataclass
class ColdStartResult:
    """What the cold start produced (weights for the plain model) and what it measured."""

    weights: dict[str, torch.Tensor]
    traces: int
    trained_tokens: int
    history: list[dict] = field(default_factory=list)
    before: ToolUseReport | None = None
    after: ToolUseReport | None = None
    seconds: float = 0.0
    cached: bool = False
    key: str = ""

    @classmethod
    def from_report(cls, report: dict, weights: dict[str, torch.Tensor] | None = None) -> ColdStartResult:
        """The result a :meth:`report` describes (with `weights` where they were kept)."""
        return cls(
            weights=weights or {},
            traces=report["traces"],
            trained_tokens=report["trained_tokens"],
            history=report["sft"],
            before=ToolUseReport(**report["before"]) if report.get("before") else None,
            after=ToolUseReport(**report["after"]) if report.get("after") else None,
            seconds=report["seconds"],
            cached=report.get("cached", False),
            key=report.get("key", ""),
        )

    def report(self) -> dict:
        return {
            "key": self.key,
            "cached": self.cached,
            "traces": self.traces,
            "trained_tokens": self.trained_tokens,
            "seconds": self.seconds,
            "sft": self.history,
            "before": self.before.as_dict() if self.before else None,
            "after": self.after.as_dict() if self.after else None,
        }


def model_fingerprint(model: torch.nn.Module) -> str:
    """A cheap digest of a model's weights (dtype, shapes, sums and a strided sample of every tensor),
    computed where the weights live and copied to the host once."""
    items = sorted(model.state_dict().items())
    sums, samples = [], []
    with torch.no_grad():
        for _, tensor in items:
            flat = tensor.detach().reshape(-1)
            sums.append(flat.sum(dtype=torch.float64))
            samples.append(flat[:: max(1, flat.numel() // 64)].double())
        host = torch.cat([torch.stack(sums), *samples]).cpu() if items else torch.zeros(0)
    h = hashlib.sha256()
    offset = len(items)
    for i, (name, tensor) in enumerate(items):
        n = len(samples[i])
        h.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}{float(host[i]):.10e}".encode())
        h.update(host[offset : offset + n].numpy().tobytes())
        offset += n
    return h.hexdigest()[:16]


def cold_start_key(config: EnvConfig, loaded: LoadedModel) -> str:
    """The cache key: model weights, trace source and settings, env prompts and tools, SFT settings, and what
    the cached held-out reports were measured on (the held-out tasks and how they are scored)."""
    from .evaluate import held_out_tasks

    cs = config.cold_start
    held_out = [[t.prompt, t.ground_truth, t.data_source] for t in held_out_tasks(config)] if cs.eval_tasks else []
    parts = {
        "version": COLD_START_VERSION,
        "model": model_fingerprint(loaded.model),
        "cold_start": cs.model_dump(),
        "source_digest": _file_digest(cs.source) if cs.source != "procedural" else None,
        "system_prompt": [m for m in arithmetic_tasks(1, 0, few_shot=config.dataset.few_shot)[0].prompt[:-1]],
        "tools": Path(config.tools).read_text() if config.tools else None,
        "interpreter": config.interpreter.model_dump(),
        "lora": config.train.lora.model_dump(),
        "dtype": config.train.dtype,
        "engine_dtype": str(loaded.dtype),  # the held-out reports were generated in it
        "micro_batch_tokens": config.train.micro_batch_tokens,
        "temperature": config.sampling.temperature,
        "max_tokens": [config.max_turns, config.max_tokens_per_turn, config.max_response_tokens],
        "held_out": hashlib.sha256(json.dumps(held_out, sort_keys=True, default=str).encode()).hexdigest(),
        "reward": config.reward.model_dump(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def cold_start_dir(key: str) -> Path:
    return cache_root() / "coldstart" / key


def build_samples(
    config: EnvConfig, controller_args: dict, loaded: LoadedModel, phase: Phase = no_bar
) -> tuple[list[Sample], list[Trajectory]]:
    """The SFT samples: procedural traces (answers checked) or the user's own trace file."""
    end = turn_end_token(loaded.tokenizer, loaded.eos_token_ids)
    cs = config.cold_start
    if cs.source != "procedural":
        return load_message_traces(cs.source, loaded.tokenizer, end), []
    require_sandbox_runtime(controller_args.get("tools") or {})  # the traces' solutions run in the sandbox
    rl_questions = {t.prompt[-1]["content"] for t in config.dataset.tasks()}
    tasks = [
        t
        for t in arithmetic_tasks(cs.n, cs.seed, few_shot=config.dataset.few_shot)
        if t.prompt[-1]["content"] not in rl_questions
    ]
    # A worked solution is short; the RL env's turn and token limits do not bind it.
    limits = {"max_turns": max(config.max_turns, 2), "max_tokens_per_turn": 4096, "max_response_tokens": 8192}
    args = {**controller_args, "config": config.model_copy(update=limits)}
    with phase("cold-start traces (solutions run in the sandbox)", len(tasks)) as update:
        trajectories = procedural_traces(args, tasks, end, seed=cs.seed, on_done=lambda _: update(advance=1))
    good = [t for t in trajectories if t.finish_reason == "done" and t.reward >= config.reward.correct and t.tool_calls]
    if not good:
        raise ColdStartError(cold_start_failure(trajectories, config.reward.correct))
    return [trajectory_sample(t) for t in good], good


def cold_start_failure(trajectories: list[Trajectory], correct: float) -> str:
    """One line on why none of the procedural traces can be trained on, with counts: the scripted
    solution was never run as a tool call, the sandbox failed it, the episode ended early, or the
    boxed answer was scored wrong."""
    counts: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    endings: Counter[str] = Counter()
    example = ""
    for t in trajectories:
        failed = [c for c in t.tool_calls if c.status != "ok"]
        statuses.update(c.status for c in failed)
        if t.finish_reason != "done":
            counts["ended"] += 1
            endings[t.finish_reason + (f" ({t.error})" if t.error else "")] += 1
        elif not t.tool_calls:
            counts["no_call"] += 1
        elif failed:
            counts["failed"] += 1
            if not example and failed[0].output.strip():
                example = failed[0].output.strip().splitlines()[-1]
        else:
            counts["wrong"] += 1
    parts = []
    if counts["no_call"]:
        parts.append(f"{counts['no_call']} answered without a tool call (no <code> block of theirs was run)")
    if counts["failed"]:
        said = f"; e.g. {example[:200]!r}" if example else ""
        parts.append(f"{counts['failed']} had tool calls that failed ({dict(statuses)}{said}): is the sandbox working?")
    if counts["ended"]:
        parts.append(f"{counts['ended']} ended before answering ({dict(endings)})")
    if counts["wrong"]:
        parts.append(f"{counts['wrong']} ran their code but the boxed answer scored below reward.correct={correct}")
    return f"no cold-start trace came out right: of {len(trajectories)} traces, " + "; ".join(parts or ["none ran"])


def run_cold_start(
    config: EnvConfig,
    loaded: LoadedModel,
    controller_args: dict,
    evaluate: Evaluator | None = None,
    phase: Phase = no_bar,
    log: Callable[[str], None] = print,
    copy: bool = True,
    sampler: SamplerNumerics = FLOAT32_SAMPLER,
    masters: dict[str, torch.Tensor] | None = None,
) -> ColdStartResult:
    """Cold-start `loaded` (from the cache when this exact cold start ran before).

    `evaluate(label)` runs the held-out report with the engines' current weights; it is called before
    SFT, and after, once the caller has loaded the returned weights (see :func:`finish_report`). `phase`
    shows the trace generation and the SFT steps as they go. ``copy=False``: SFT trains `loaded`'s module
    itself where it can (nothing runs on it: vLLM serves the rollouts), not a copy. `sampler` and `masters`:
    as :func:`~srt_agent.rl.policy.build_policy` takes them.
    """
    key = cold_start_key(config, loaded)
    folder = cold_start_dir(key)
    if (folder / "weights.pt").is_file() and (folder / "report.json").is_file():
        report = json.loads((folder / "report.json").read_text())
        weights = torch.load(folder / "weights.pt", map_location="cpu", weights_only=True)
        log(f"cold start: cached ({folder})")
        return dataclasses.replace(ColdStartResult.from_report(report, weights), cached=True, key=key)
    start = time.perf_counter()
    before = evaluate("before cold start") if evaluate is not None else None
    samples, trajectories = build_samples(config, controller_args, loaded, phase)
    tokens = sum(s.trained_tokens for s in samples)
    log(f"cold start: {len(samples)} traces, {tokens} trained tokens, {sum(len(s) for s in samples)} tokens in all")
    cs, train = config.cold_start, config.train
    policy = Policy(
        loaded.model,
        config.sampling.temperature,
        train.lora,
        copy=copy,
        masters=masters,
        **sampler.policy_options(train),
    )
    with phase("cold start SFT", None, "loss {task.fields[loss]:.3f}", loss=float("nan")) as update:
        history = sft_epochs(
            policy,
            samples,
            cs.epochs,
            cs.lr,
            cs.batch_size,
            train.micro_batch_tokens,
            seed=cs.seed,
            on_step=lambda done, total, loss: update(completed=done, total=total, loss=loss),
        )
    weights = policy.engine_weights()
    del policy
    result = ColdStartResult(
        weights, len(samples), tokens, history, before, None, time.perf_counter() - start, False, key
    )
    _save(folder, result, trajectories)
    return result


def finish_report(result: ColdStartResult, evaluate: Evaluator | None) -> None:
    """Measure the cold-started policy (engines already hold its weights) and cache the report."""
    if result.cached or evaluate is None:
        return
    result.after = evaluate("after cold start")
    folder = cold_start_dir(result.key)
    if folder.is_dir():
        write_atomic(folder / "report.json", json.dumps(result.report(), indent=2))


def _save(folder: Path, result: ColdStartResult, trajectories: list[Trajectory]) -> None:
    with atomic_folder(folder) as tmp:
        torch.save(result.weights, tmp / "weights.pt")
        with (tmp / "traces.jsonl").open("w") as f:
            for traj in trajectories:
                f.write(json.dumps(traj.to_json()) + "\n")
        (tmp / "report.json").write_text(json.dumps(result.report(), indent=2))


def cold_start_line(cold: ColdStartResult) -> str:
    """One line on the cold start: traces, time, held-out tool use before and after."""
    text = f"cold start: {cold.traces} traces, {cold.trained_tokens} trained tokens" + (
        " (cached)" if cold.cached else f", {cold.seconds:.0f} s"
    )
    if cold.before and cold.after:
        b, a = cold.before, cold.after
        text += (
            f"; held-out tool calls {b.tool_call_rate:.0%} → {a.tool_call_rate:.0%}, clean code runs "
            f"{b.code_ok_rate:.0%} → {a.code_ok_rate:.0%}, accuracy {b.accuracy:.0%} → {a.accuracy:.0%}"
        )
    return text
