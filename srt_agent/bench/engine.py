"""`srt-agent bench engine`: the engine with each drafter on a GRPO-like workload, plus transformers.

Workload: P chat prompts × n samples at temperature 1.0, for several epochs over the same prompts
with each drafter's trees kept between epochs (as across RL steps); every epoch draws new seeds.
Each (method, batch size) gets a fresh engine, and the methods' epochs interleave (epoch by epoch, in a
rotating order) so that drifts in the machine's speed fall on all of them alike; all runs of a batch size
use the same seeds, so every
method's tokens can be checked against `none`'s (`identical_to_none`). The engines' start-up
calibration shows what verifying more tokens costs on the machine (`verification_cost`).
transformers' own `generate` at batch 1, with and without prompt lookup, is the outside baseline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from ..drafting import exact_drafters
from ..engine import Engine, EngineOptions
from ..engine.params import SamplingParams
from ..models import LoadedModel, load_model
from ..rl.evaluate import ratio_text
from .vllm import pair_ratios

QUESTIONS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Compute the sum of the squares of the integers from 1 to 20 with Python code, then state the result.",
    "Write a Python function that checks whether a string is a palindrome.",
    "How many positive divisors does 360 have? Use Python to check.",
    "Write a Python function that sorts a list of numbers with bubble sort.",
    "What is 15% of 240? Show the computation in Python.",
    "Write a Python function that counts the vowels in a string.",
    "Find the greatest common divisor of 84 and 126 using Python.",
]
# head to head, per batch size: the first method's time over the second's, paired by epoch (same seeds)
PAIRS = (("srt", "arctic"), ("srt", "suffix"), ("srt", "none"), ("arctic", "none"))
DTYPES = ("float32", "bfloat16")
# the default sits through in minutes on 2 cores: SRT against plain decoding and the strongest model-free drafter
DEFAULT_METHODS = ("none", "srt", "arctic")
DEFAULT_BATCHES = (1, 8)
ALL_BATCHES = (1, 8, 32)  # with every exact drafter and transformers' generate: `--all`
DEFAULT_MINUTES, ALL_MINUTES = 6, 25  # on an idle 2-core machine (docs/benchmarks/index.md)


@dataclass
class EngineBenchConfig:
    """Sizes of the benchmark; `requests` per batch size is max(batch, prompts * samples)."""

    model: str = "smollm2"
    prompts: int = 4
    samples: int = 2
    epochs: int = 2
    max_tokens: int = 64
    batches: tuple[int, ...] = DEFAULT_BATCHES
    methods: tuple[str, ...] = DEFAULT_METHODS
    hf_baseline: bool = False
    max_draft_tokens: int = 16
    adaptive_drafts: bool = True  # False: verify every drafted node (the drafters' acceptance ceiling)
    temperature: float = 1.0
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"  # bfloat16: a bf16 policy (cheap verification on CPUs with AMX)
    threads: int | None = None  # torch intra-op threads (None: torch's default)
    batch_invariant: bool | str = "auto"  # the engine's float64 attention (runner/numerics.py)
    notes: list[str] = field(default_factory=list)

    def runs(self) -> int:
        """Epochs the benchmark runs in all (transformers' generate times two per epoch at batch 1)."""
        hf = 2 * self.epochs if self.hf_baseline and 1 in self.batches else 0
        methods = available_methods(self.methods)[0]
        return len(self.batches) * len({"none", *methods}) * self.epochs + hf

    @classmethod
    def everything(cls, **sizes) -> EngineBenchConfig:
        """The full matrix: every exactly on-policy drafter in the registry at every batch size, transformers'
        generate beside them (`--all`)."""
        return cls(methods=exact_drafters(), batches=ALL_BATCHES, hf_baseline=True, **sizes)

    @classmethod
    def quick(cls) -> EngineBenchConfig:
        return cls(
            model="tiny-llama",
            prompts=2,
            samples=1,
            epochs=2,
            max_tokens=8,
            batches=(1, 4),
            methods=("none", "srt", "self", "srt+self"),
            hf_baseline=True,
            threads=1,
        )


def engine_plan(config: EngineBenchConfig) -> str:
    """What the benchmark will run and, for the shapes whose time was measured (the default, `--all`), about
    how long that takes on 2 cores."""
    methods = ", ".join(dict.fromkeys(["none", *available_methods(config.methods)[0]]))
    hf = ", transformers' generate at batch 1" if config.hf_baseline and 1 in config.batches else ""
    what = (
        f"{methods} at batch {', '.join(map(str, config.batches))}{hf}; {config.epochs} epochs of "
        f"{config.prompts} prompts × {config.samples} samples × {config.max_tokens} tokens: {config.runs()} runs"
    )
    if config.model == "tiny-llama":
        return what + "; seconds"
    shape = _shape(config)
    if shape == _shape(EngineBenchConfig(dtype=config.dtype)):
        return what + f"; about {DEFAULT_MINUTES} min on 2 cores (--all: every drafter, about {ALL_MINUTES} min)"
    if shape == _shape(EngineBenchConfig.everything(dtype=config.dtype)):
        return what + f"; about {ALL_MINUTES} min on 2 cores"
    return what


def _shape(config: EngineBenchConfig) -> tuple:
    return (
        config.model,
        config.prompts,
        config.samples,
        config.epochs,
        config.max_tokens,
        config.batches,
        set(config.methods),
        config.hf_baseline,
        config.dtype,
    )


def chat_prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    tok = loaded.tokenizer
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in (QUESTIONS * math.ceil(count / len(QUESTIONS)))[:count]
    ]
    return [tok.encode(t) for t in texts]


def workload(config: EngineBenchConfig, prompts: list[list[int]], batch: int, epoch: int):
    """(prompts, params, prompt_keys) of one epoch at one batch size: GRPO groups of samples."""
    samples = max(config.samples, math.ceil(batch / len(prompts)))
    items = [(i, s) for i in range(len(prompts)) for s in range(samples)]
    params = [
        SamplingParams(
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            seed=config.seed + 100_000 * epoch + 1000 * i + s,
        )
        for i, s in items
    ]
    return [prompts[i] for i, _ in items], params, [f"p{i}" for i, _ in items]


def open_engine(loaded, config, method, batch, max_context) -> Engine:
    """A fresh engine with drafter `method` at batch size `batch` (it calibrates its cost model)."""
    knobs = {k: getattr(config, k) for k in ("device", "max_draft_tokens", "adaptive_drafts", "batch_invariant")}
    return Engine(loaded, EngineOptions(drafter=method, max_batch=batch, max_context=max_context, **knobs))


def run_epoch(engine: Engine, loaded, config, method, batch, prompts, epoch, report) -> dict:
    """One epoch of the workload on `engine` (its trees kept from earlier epochs), then an RL step's
    weight update with the same weights (a model drafter rebuilds) unless it is the last epoch."""
    ps, params, keys = workload(config, prompts, batch, epoch)
    before = engine.stats()
    t0 = time.perf_counter()
    outs = engine.generate(ps, params, prompt_keys=keys)
    wall = time.perf_counter() - t0
    engine.end_step()
    if epoch + 1 < config.epochs:
        engine.update_weights(loaded.model.state_dict())
    after = engine.stats()
    steps = after["steps"] - before["steps"]
    tokens = sum(len(o.token_ids) for o in outs)
    run = dict(
        method=method,
        batch=batch,
        epoch=epoch + 1,
        requests=len(ps),
        wall_s=wall,
        tokens=tokens,
        tokens_per_s=tokens / wall,
        forwards=steps,
        tokens_per_forward=tokens / max(1, steps),
        accepted_per_step=(after["draft_accepted"] - before["draft_accepted"]) / max(1, steps),
        draft_verified_per_step=(after["draft_verified"] - before["draft_verified"]) / max(1, steps),
        draft_s=after["draft_s"] - before["draft_s"],
        **model_draft_figures(before, after),
        forward_s=after["forward_s"] - before["forward_s"],
        drafter_update_s=after["drafter_update_s"] - before["drafter_update_s"],
        errors=sum(o.finish_reason == "error" for o in outs),
        outputs=[o.token_ids for o in outs],
    )
    report(run)
    return run


def run_batch(
    loaded, config, methods, batch, prompts, max_context, report, now: Callable[[str], None] = lambda what: None
) -> tuple[list[dict], list[dict]]:
    """Every method's epochs at one batch size, interleaved: epoch e runs each method once, in an order
    rotated by e, so a drift in the machine's speed (other jobs, clocks) hits all methods alike and no
    method always runs first (cold kernels). Returns the runs and the first drafting engine's start-up
    measurement of verification time per step shape; `now` hears what starts."""
    now(f"batch {batch}: starting {len(methods)} engines (each calibrates)")
    engines = {m: open_engine(loaded, config, m, batch, max_context) for m in methods}
    calibration = next((e.cost_model.measured() for m, e in engines.items() if m != "none"), [])
    runs = []
    for epoch in range(config.epochs):
        shift = epoch % len(methods)
        for method in methods[shift:] + methods[:shift]:
            now(f"{method} b={batch} epoch {epoch + 1}")
            runs.append(run_epoch(engines[method], loaded, config, method, batch, prompts, epoch, report))
    return runs, calibration


def model_draft_figures(before: dict, after: dict) -> dict:
    """A model drafter's figures between two `Engine.stats()`: its per-token acceptance (of nodes whose
    parent was accepted) and its seconds per drafted token (None where it drafted nothing)."""
    tested = after["model_draft_tested"] - before["model_draft_tested"]
    drafted = after["model_drafted"] - before["model_drafted"]
    return dict(
        model_drafted=drafted,
        model_acceptance=(after["model_draft_accepted"] - before["model_draft_accepted"]) / tested if tested else None,
        model_draft_s_per_token=(after["model_draft_s"] - before["model_draft_s"]) / drafted if drafted else None,
    )


def run_hf(loaded, config, prompts, prompt_lookup: bool, report, now) -> list[dict]:
    """transformers' generate at batch 1 over the batch-1 workload (sampling, same lengths)."""
    model, device = loaded.model, next(loaded.model.parameters()).device
    runs = []
    name = "hf-generate+prompt-lookup" if prompt_lookup else "hf-generate"
    for epoch in range(config.epochs):
        now(f"{name} b=1 epoch {epoch + 1}")
        ps, params, _ = workload(config, prompts, 1, epoch)
        tokens, t0 = 0, time.perf_counter()
        for prompt, p in zip(ps, params):
            torch.manual_seed(p.seed)
            kwargs = dict(prompt_lookup_num_tokens=10) if prompt_lookup else {}
            ids = torch.tensor([prompt], device=device)
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=config.temperature,
                top_p=1.0,
                top_k=0,
                max_new_tokens=config.max_tokens,
                eos_token_id=loaded.eos_token_ids or None,
                pad_token_id=(loaded.eos_token_ids or [0])[0],
                **kwargs,
            )
            tokens += out.shape[1] - len(prompt)
        wall = time.perf_counter() - t0
        runs.append(
            dict(
                method=name,
                batch=1,
                epoch=epoch + 1,
                requests=len(ps),
                wall_s=wall,
                tokens=tokens,
                tokens_per_s=tokens / wall,
                tokens_per_forward=None,
                identical_to_none=None,
            )
        )
        report(runs[-1])
    return runs


def available_methods(methods: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(methods that can run here, notes on those skipped)."""
    from ..drafting import drafter_unavailable

    ok, notes = [], []
    for m in methods:
        reason = drafter_unavailable(m)
        if reason is None:
            ok.append(m)
        else:
            notes.append(f"skipped {m}: {reason}")
    return ok, notes


def run_engine_bench(
    config: EngineBenchConfig,
    report: Callable[[dict], None] = lambda r: None,
    now: Callable[[str], None] = lambda what: None,
) -> dict:
    """Run every method at every batch size; returns {"config", "runs", "summary", "verification_cost",
    "notes"}; `report` sees each run as it finishes, `now` what starts. verification_cost holds, per batch size, the seconds of a step (forward, LM head,
    sampling) per shape (sequences, tokens fed) as the first drafting engine measured them at start-up."""
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads or threads)
    try:
        return _run(config, report, now)
    finally:
        torch.set_num_threads(threads)


def _run(config: EngineBenchConfig, report: Callable[[dict], None], now: Callable[[str], None]) -> dict:
    if config.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {config.dtype!r}")
    now(f"loading {config.model}")
    loaded = load_model(config.model, dtype=config.dtype, device=config.device)
    prompts = chat_prompts(loaded, config.prompts)
    max_context = max(len(p) for p in prompts) + config.max_tokens + 8
    methods, notes = available_methods(config.methods)
    if "none" not in methods:
        methods.insert(0, "none")
    runs: list[dict] = []
    costs: list[dict] = []
    head_to_head: dict[str, dict] = {}
    for batch in config.batches:
        batch_runs, calibration = run_batch(loaded, config, methods, batch, prompts, max_context, report, now)
        head_to_head[str(batch)] = pair_ratios(epoch_steps(batch_runs), PAIRS)
        costs += [dict(batch=batch, **row) for row in calibration]
        reference = {r["epoch"]: r["outputs"] for r in batch_runs if r["method"] == "none"}
        for r in batch_runs:
            r["identical_to_none"] = r["outputs"] == reference[r["epoch"]]
            r["identical_share"] = identical_share(r["outputs"], reference[r["epoch"]])
        runs += sorted(batch_runs, key=lambda r: (methods.index(r["method"]), r["epoch"]))
        if batch == 1 and config.hf_baseline:
            for lookup in (False, True):
                runs += run_hf(loaded, config, prompts, lookup, report, now)
    for r in runs:
        r.pop("outputs", None)
    notes += [f"torch threads: {torch.get_num_threads()}", *config.notes]
    return dict(
        config=asdict(config),
        runs=runs,
        summary=summarize(runs),
        head_to_head=head_to_head,
        verification_cost=costs,
        notes=notes,
    )


def epoch_steps(runs: list[dict]) -> list[dict]:
    """One batch size's runs as paired units, one per epoch (the same seeds for every method): each method's
    wall time and tokens, and whether its trees were warm (epochs after the first: ``revisit``)."""
    epochs = sorted({r["epoch"] for r in runs})
    return [
        {
            "revisit": epoch > 1,
            "methods": {
                r["method"]: {"gen_s": r["wall_s"], "tokens": r["tokens"]} for r in runs if r["epoch"] == epoch
            },
        }
        for epoch in epochs
    ]


def result_lines(result: dict) -> list[str]:
    """What the table leaves out, a line each: the head-to-head ratios, the verification cost, the notes."""
    return head_to_head_lines(result) + verification_cost_lines(result) + result["notes"]


def head_to_head_lines(result: dict) -> list[str]:
    """One line per batch size and pair: the first method's time over the second's, with 95% paired bootstrap
    intervals over the epochs (all, and warm trees)."""
    lines = []
    for batch, pairs in result.get("head_to_head", {}).items():
        for name, row in pairs.items():
            spans = row["intervals"]
            lines.append(
                f"batch {batch}, {name} time: {ratio_text(row['time_ratio_all'], spans.get('time_ratio_all'))}, "
                f"warm trees {ratio_text(row['time_ratio_revisit'], spans.get('time_ratio_revisit'))}"
            )
    return lines


def identical_share(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """Share of tokens that agree with the reference before the first difference of each output
    (rounding differs between batch shapes and can flip a near-tie: rarely in float32, often in bf16)."""
    same = total = 0
    for a, b in zip(outputs, reference):
        n = min(len(a), len(b))
        same += next((i for i in range(n) if a[i] != b[i]), n)
        total += max(len(a), len(b))
    return same / total if total else 1.0


def summarize(runs: list[dict]) -> list[dict]:
    """Per (method, batch, epochs): totals over epoch 1 (cold trees) and over epochs >= 2 (warm trees)."""
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["method"], r["batch"], "1" if r["epoch"] == 1 else "2+"), []).append(r)
    out = []
    for (method, batch, epochs), rs in groups.items():
        wall, tokens = sum(r["wall_s"] for r in rs), sum(r["tokens"] for r in rs)
        forwards = sum(r.get("forwards") or 0 for r in rs)
        drafted = sum(r.get("model_drafted") or 0 for r in rs)
        tested = [r for r in rs if r.get("model_acceptance") is not None]
        row = dict(
            method=method,
            batch=batch,
            epochs=epochs,
            wall_s=wall,
            tokens=tokens,
            tokens_per_s=tokens / wall,
            tokens_per_forward=tokens / forwards if forwards else None,
            accepted_per_step=sum(r.get("accepted_per_step", 0) * (r.get("forwards") or 0) for r in rs) / forwards
            if forwards
            else None,
            model_acceptance=sum(r["model_acceptance"] * r["model_drafted"] for r in tested)
            / sum(r["model_drafted"] for r in tested)
            if tested
            else None,
            model_draft_s_per_token=sum(
                (r["model_draft_s_per_token"] or 0) * r["model_drafted"] for r in rs if r.get("model_drafted")
            )
            / drafted
            if drafted
            else None,
            identical_to_none=all(r.get("identical_to_none") for r in rs)
            if rs[0].get("identical_to_none") is not None
            else None,
            identical_share=sum(r["identical_share"] * r["tokens"] for r in rs) / tokens
            if "identical_share" in rs[0]
            else None,
        )
        out.append(row)
    for row in out:
        base = next(
            (r for r in out if r["method"] == "none" and r["batch"] == row["batch"] and r["epochs"] == row["epochs"]),
            None,
        )
        row["speedup_vs_none"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
    return out


def summary_table(result: dict):
    """A rich table of the summary rows."""
    from rich.table import Table

    table = Table(title="engine benchmark (epoch 1: cold trees; 2+: warm)")
    for col in (
        "method",
        "batch",
        "epochs",
        "wall s",
        "tokens",
        "tok/s",
        "tok/fwd",
        "acc/step",
        "model acc",
        "ms/draft tok",
        "speedup",
        "identical",
    ):
        table.add_column(col, justify="right" if col not in ("method",) else "left")

    def fmt(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    for row in result["summary"]:
        table.add_row(
            row["method"],
            str(row["batch"]),
            row["epochs"],
            fmt(row["wall_s"], ".1f"),
            str(row["tokens"]),
            fmt(row["tokens_per_s"], ".1f"),
            fmt(row["tokens_per_forward"]),
            fmt(row["accepted_per_step"]),
            fmt(row["model_acceptance"]),
            fmt(None if row["model_draft_s_per_token"] is None else 1000 * row["model_draft_s_per_token"], ".1f"),
            fmt(row["speedup_vs_none"]) + ("x" if row["speedup_vs_none"] is not None else ""),
            "-"
            if row["identical_to_none"] is None
            else ("yes" if row["identical_to_none"] else f"{row['identical_share']:.1%}"),
        )
    return table


def verification_cost_lines(result: dict) -> list[str]:
    """One line per batch size: a step's milliseconds per number of tokens fed, alone and batched."""
    lines = []
    for batch in sorted({c["batch"] for c in result.get("verification_cost", [])}):
        rows = [c for c in result["verification_cost"] if c["batch"] == batch]
        by_shape = {}
        for c in rows:
            by_shape.setdefault(c["sequences"], []).append(f"{c['tokens']}: {1000 * c['seconds']:.1f}")
        shapes = "; ".join(
            f"{q} sequence{'s' if q > 1 else ''}, tokens fed: ms {', '.join(v)}" for q, v in sorted(by_shape.items())
        )
        lines.append(f"verification cost at batch {batch}: {shapes}")
    return lines
