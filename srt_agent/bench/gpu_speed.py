"""The GPU check's speed stage: the engine in bf16 on random-weight models shaped like Qwen2.5-1.5B and
-0.5B, SRT against plain decoding at each batch size, and what verification costs.

Acceptance is made meaningful by a sharpened output head (`gpu_setup.sharpen_head`): a random model's logits at
T = 1 are close to uniform over 151,936 tokens, so no two samples would share a token. Before any engine
runs, the final norm's weight (the LM head's input; the head is tied to the embeddings, which stay as they
are) is scaled so that the mean next-token entropy at T = 1 over random prompts is `target_entropy` nats
(the result states the scale and the entropy measured after it). Sampling then runs at T = 1. Samples of a
prompt share their tokens until one draws a less likely token, after which a random model's contexts
have nothing in common: SRT's trees help through shared prefixes only, a harder case than real text.

The workload is `bench engine`'s (`bench/engine.py`: GRPO groups of `group` samples per prompt, two
epochs over the same prompts with new seeds, trees kept, methods interleaved); the verification costs
use `bench roofline`'s device measurements and byte/FLOP counts (`bench/roofline.py`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from ..runner.model_runner import Chunk, ModelRunner
from .engine import EngineBenchConfig, identical_share, run_batch, summarize
from .gpu_setup import (
    Deadline,
    GpuCheckConfig,
    memory_figures,
    random_model,
    reset_peak_memory,
    sharpen_head,
    synchronize,
)
from .roofline import ModelCost, _best_time, measure_bandwidth, measure_gemm

GPU_SPEED_METHODS = ["none", "srt"]


def bench_config(config: GpuCheckConfig, device: torch.device) -> EngineBenchConfig:
    return EngineBenchConfig(
        samples=config.group,
        epochs=2,
        max_tokens=config.max_tokens,
        batches=config.batches,
        methods=tuple(GPU_SPEED_METHODS),
        hf_baseline=False,
        max_draft_tokens=config.max_draft_tokens,
        adaptive_drafts=True,
        temperature=1.0,
        seed=config.seed,
        device=str(device),
        dtype="bfloat16",
    )


def batch_runs(loaded, config: GpuCheckConfig, device, batch: int, prompts, log) -> tuple[list[dict], list]:
    """Both methods' epochs at one batch size (`bench engine`'s protocol), each run compared with none's."""
    bench = bench_config(config, device)
    groups = prompts[: max(1, batch // config.group)]
    max_context = config.prompt_tokens + config.max_tokens + 8

    def report(run: dict) -> None:
        log(f"{loaded.name} b={batch} {run['method']} epoch {run['epoch']}: {run['tokens_per_s']:.0f} tok/s")

    runs, calibration = run_batch(loaded, bench, GPU_SPEED_METHODS, batch, groups, max_context, report)
    failed = [f"{r['method']} epoch {r['epoch']}" for r in runs if r["errors"]]
    if failed:
        raise RuntimeError(f"{loaded.name} batch {batch}: requests failed in {', '.join(failed)}")
    reference = {r["epoch"]: r["outputs"] for r in runs if r["method"] == "none"}
    for r in runs:
        r["model"] = loaded.name
        r["identical_to_none"] = r["outputs"] == reference[r["epoch"]]
        r["identical_share"] = identical_share(r["outputs"], reference[r["epoch"]])
        del r["outputs"]
    return runs, calibration


def verification_costs(loaded, config: GpuCheckConfig, device: torch.device, deadline: Deadline) -> dict:
    """Per batch size B and drafted tokens k per sequence: a plain step (B x 1 token) and a verification step
    (B x (1 + k), a chain of k draft nodes), timed through the engine's runner, against the roofline floor
    max(bytes / bandwidth, FLOPs / GEMM throughput). `cost_per_drafted_token` = (t_k - t_0) / (k t_0): what
    verifying one drafted token costs as a share of what a plain step spends per emitted token (a drafted
    token pays when it is accepted more often than that)."""
    ks = config.drafted_per_sequence
    context = config.prompt_tokens + config.max_tokens // 2
    slots = max(config.batches)
    runner = ModelRunner(loaded.model, slots, context + max(ks) + 2, max(ks) + 1, device)
    sync = lambda: synchronize(device)  # noqa: E731
    cost = ModelCost.of(runner)
    bandwidth = measure_bandwidth(device, sync, 3, "wall")
    gemm = measure_gemm(
        runner, sync, 3, "wall", rows=tuple(sorted({b * (1 + k) for b in config.batches for k in (0, *ks)}))
    )
    peak, bw = max(gemm.values()) * 1e9, bandwidth["gemv_gb_s"] * 1e9
    prompt = [(7 * i + 3) % runner.vocab_size for i in range(context)]
    for lo in range(0, slots, 16):
        runner.forward([Chunk(s, 0, prompt, context) for s in range(lo, min(slots, lo + 16))])
    rows = []
    for b in config.batches:
        if deadline.expired():
            rows.append(dict(batch=b, skipped="time budget"))
            continue
        times, floors = {}, {}
        for k in (0, *ks):
            chunks = [Chunk(s, context, prompt[: 1 + k], 1, list(range(-1, k - 1))) for s in range(b)]
            times[k] = _best_time(lambda c=chunks: runner.logits(runner.forward(c)), sync, 3, "wall", min_s=0.02)
            nbytes, flops = cost.step(b, 1 + k, context)
            floors[k] = (max(nbytes / bw, flops / peak), "memory" if nbytes / bw >= flops / peak else "compute")
        for k in ks:
            rows.append(
                dict(
                    batch=b,
                    drafted_per_sequence=k,
                    plain_step_ms=times[0] * 1e3,
                    verify_step_ms=times[k] * 1e3,
                    cost_per_drafted_token=(times[k] - times[0]) / (k * times[0]),
                    floor_plain_ms=floors[0][0] * 1e3,
                    floor_verify_ms=floors[k][0] * 1e3,
                    floor_bound=floors[k][1],
                    floor_cost_per_drafted_token=(floors[k][0] - floors[0][0]) / (k * floors[0][0]),
                    plain_step_vs_floor=times[0] / floors[0][0],
                )
            )
    return dict(context=context, bandwidth=bandwidth, gemm_gflop_s={str(k): v for k, v in gemm.items()}, shapes=rows)


def run_speed(
    config: GpuCheckConfig,
    device: torch.device,
    deadline: Deadline,
    save: Callable[[dict], None],
    log: Callable[[str], None],
) -> dict:
    """The stage: every model is built and sharpened first, then batch sizes run in turn over all models (a
    cut-off run loses the largest batches, not a whole model), then each model's verification costs."""
    rng = random.Random(config.seed)
    groups = max(1, max(config.batches) // config.group)
    result: dict = dict(models={}, runs=[], calibration=[], skipped=[])
    models = {}
    for shape in config.shapes:
        loaded = random_model(shape, torch.bfloat16, device, config.seed)
        prompts = [[rng.randrange(shape.vocab_size) for _ in range(config.prompt_tokens)] for _ in range(groups)]
        result["models"][shape.name] = dict(
            shape=vars(shape), sharpening=sharpen_head(loaded.model, prompts[:8], config.target_entropy)
        )
        models[shape.name] = (loaded, prompts)
    save(result)
    for batch in config.batches:
        for name, (loaded, prompts) in models.items():
            if deadline.expired():
                result["skipped"].append(f"{name} batch {batch}: time budget")
                continue
            reset_peak_memory(device)
            runs, calibration = batch_runs(loaded, config, device, batch, prompts, log)
            result["runs"] += runs
            result["calibration"] += [dict(model=name, batch=batch, **row) for row in calibration]
            result["models"][name][f"memory_batch_{batch}"] = memory_figures(device)
            save(result)
    for name, (loaded, _) in models.items():
        if deadline.expired():
            result["skipped"].append(f"{name} verification costs: time budget")
            continue
        verification = verification_costs(loaded, config, device, deadline)
        result["models"][name]["verification"] = verification
        result["skipped"] += [
            f"{name} verification at batch {r['batch']}" for r in verification["shapes"] if "skipped" in r
        ]
        save(result)
    result["summary"] = [
        dict(model=m, **row) for m in models for row in summarize([r for r in result["runs"] if r["model"] == m])
    ]
    result["headline"] = headline(result)
    return result


def headline(result: dict) -> dict:
    """Warm trees (epoch 2): SRT's tokens/s, tokens per forward and speed-up over none, per model and batch."""
    out = {}
    for row in result["summary"]:
        if row["method"] == "srt" and row["epochs"] == "2+":
            out[f"{row['model']} b={row['batch']}"] = dict(
                srt_tokens_per_s=round(row["tokens_per_s"], 1),
                tokens_per_forward=round(row["tokens_per_forward"] or 0.0, 2),
                speedup_vs_none=round(row["speedup_vs_none"] or 0.0, 3),
                identical_share=round(row["identical_share"], 4),
            )
    return out
