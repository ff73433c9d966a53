"""`srt-agent bench roofline`: what a verification step should cost on this device, and what it costs.

Measures the device (streaming bandwidth as the model's own matrix-vector products see it, GEMM
throughput by rows), counts the model's bytes and FLOPs per step shape (decoder weights, the LM head
for every verified position, the KV cache read by attention), predicts each shape's floor as
``max(bytes / bandwidth, flops / GEMM throughput)`` and times the engine's forward pass plus LM head
for one sequence × {1, 2, 4, 8, 16, 32} tokens and {8, 32} sequences × 1 token, each as a ratio to its
floor. A profile of the one-token step says where the time beyond the floor goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F

from ..console import Progress
from ..models import LoadedModel
from ..rl.roofline_cost import ModelShape
from ..runner.device_info import detect_device
from ..runner.model_runner import Chunk, ModelRunner
from ..runner.packed_linear import set_packing

STEP_SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (1, 32), (8, 1), (32, 1)]  # (sequences, tokens each)
GEMM_ROWS = (1, 2, 4, 8, 16, 32, 64, 256)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _best_time(fn: Callable[[], object], sync: Callable[[], None], reps: int, clock: str, min_s: float = 0.05) -> float:
    """Best time of `fn` over `reps` rounds (each at least `min_s`, averaged within the round).

    `clock` "wall" is wall time; "cpu" is the process's CPU time, which on a shared machine leaves out
    the time other processes held the cores (meaningful with one thread, where it approximates the
    wall time of an idle machine; memory-bandwidth contention still counts).
    """
    now = CLOCKS[clock]
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        calls, t0 = 0, now()
        while True:
            fn()
            calls += 1
            sync()
            elapsed = now() - t0
            if elapsed >= min_s:
                break
        best = min(best, elapsed / calls)
    return best


class ModelCost(ModelShape):
    """Bytes and FLOPs of the loaded model's step shapes (the formula is the projection's, `rl/roofline_cost.py`)."""

    @classmethod
    def of(cls, runner: ModelRunner) -> ModelCost:
        model = runner.model
        head = model.get_output_embeddings()
        layers = runner.decoder.layers if hasattr(runner.decoder, "layers") else runner.decoder.h
        linear_params = sum(p.numel() for layer in layers for n, p in layer.named_parameters() if p.dim() >= 2)
        layer_bytes = sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters())
        kv = sum(k.shape[1] * k.shape[3] * k.element_size() * 2 for k in runner.kv.keys)
        heads = (
            model.config.num_attention_heads if hasattr(model.config, "num_attention_heads") else model.config.n_head
        )
        head_dim = runner.kv.keys[0].shape[3]
        return cls(
            layer_bytes=layer_bytes,
            head_bytes=head.weight.numel() * head.weight.element_size(),
            layer_params=linear_params,
            head_params=head.weight.numel(),
            kv_bytes_per_token=kv,
            attention_macs_per_key=2 * heads * head_dim * runner.kv.num_layers,
        )


def measure_bandwidth(device: torch.device, sync, reps: int, clock: str, nbytes: int = 256 << 20) -> dict:
    """Streaming bandwidth: a matrix-vector product over `nbytes` of fp32 weights (what a one-token
    step does to every linear layer), and a plain copy (read + write)."""
    cols = 1024
    weight = torch.randn(nbytes // (4 * cols), cols, device=device)
    x = torch.randn(1, cols, device=device)
    gemv_s = _best_time(lambda: F.linear(x, weight), sync, reps, clock)
    dst = torch.empty_like(weight)
    copy_s = _best_time(lambda: dst.copy_(weight), sync, reps, clock)
    return dict(
        gemv_gb_s=weight.nbytes / gemv_s / 1e9,
        copy_gb_s=2 * weight.nbytes / copy_s / 1e9,
        buffer_mb=weight.nbytes >> 20,
    )


def measure_gemm(
    runner: ModelRunner, sync, reps: int, clock: str, rows: tuple[int, ...] = GEMM_ROWS
) -> dict[int, float]:
    """GFLOP/s of the model's own linear shapes (one decoder layer's linears, as F.linear runs them) by rows."""
    layers = runner.decoder.layers if hasattr(runner.decoder, "layers") else runner.decoder.h
    weights = [p for n, p in layers[0].named_parameters() if p.dim() == 2 and "embed" not in n]
    out = {}
    for m in rows:
        xs = [torch.randn(m, w.shape[1], device=w.device, dtype=w.dtype) for w in weights]

        def run(xs: list[torch.Tensor] = xs) -> None:
            for x, w in zip(xs, weights):
                F.linear(x, w)

        seconds = _best_time(run, sync, reps, clock)
        out[m] = 2 * m * sum(w.numel() for w in weights) / seconds / 1e9
    return out


def profile_step(runner: ModelRunner, chunks: list[Chunk], top: int = 12) -> list[dict]:
    """Self time per operator of one step (forward + LM head), largest first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.device.type == "cuda" else [])
    runner.logits(runner.forward(chunks))
    with profile(activities=activities) as prof:
        for _ in range(3):
            runner.logits(runner.forward(chunks))
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    return [
        dict(
            op=e.key,
            ms_per_step=e.self_cpu_time_total / 3 / 1e3,
            share=e.self_cpu_time_total / total,
            calls_per_step=e.count // 3,
        )
        for e in rows[:top]
    ]


def roofline_units(profile: bool) -> int:
    """Measurements `run_roofline` makes: bandwidth, GEMMs, each step shape, and the two profiles."""
    return 2 + len(STEP_SHAPES) + (2 if profile else 0)


def run_roofline(
    model: LoadedModel,
    context: int = 512,
    reps: int = 5,
    profile: bool = True,
    clock: str = "wall",
    work: Progress | None = None,
) -> dict:
    """Measure the device and the model's step shapes; returns the JSON-ready result. `work` hears of each
    measurement (`roofline_units`) as it ends.

    Where the runner packs its linears, every shape is also timed with packing off, alternating
    within the same run (``step_ms_unpacked``).
    """
    work = work or Progress.unseen()
    device = model.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    info = detect_device(device)
    max_seqs = max(s for s, _ in STEP_SHAPES)
    max_tokens = max(t for _, t in STEP_SHAPES)
    runner = ModelRunner(model.model, max_seqs, context + max_tokens, 1, device)
    cost = ModelCost.of(runner)
    work.now("memory bandwidth")
    bandwidth = measure_bandwidth(device, sync, reps, clock)
    work.done(f"memory bandwidth: {bandwidth['gemv_gb_s']:.1f} GB/s")
    gemm = measure_gemm(runner, sync, reps, clock)
    work.done(f"GEMMs: peak {max(gemm.values()):.0f} GFLOP/s")
    peak = max(gemm.values())
    bw = bandwidth["gemv_gb_s"] * 1e9
    prompt = [(7 * i + 3) % runner.vocab_size for i in range(context)]
    for slot in range(max_seqs):
        runner.forward([Chunk(slot, 0, prompt, context)])
    shapes = []
    for sequences, tokens in STEP_SHAPES:
        chunks = [Chunk(slot, context, prompt[:tokens], tokens) for slot in range(sequences)]
        times = {True: float("inf"), False: float("inf")}
        for _ in range(reps):  # alternate packed and plain linears so both see the same machine
            for packed in [True, False] if runner.packed_linears else [False]:
                set_packing(runner.model, packed)
                step = lambda chunks=chunks: runner.logits(runner.forward(chunks))  # noqa: E731
                times[packed] = min(times[packed], _best_time(step, sync, 1, clock, min_s=0.0))
        set_packing(runner.model, runner.packed_linears)
        seconds = times[runner.packed_linears]
        nbytes, flops = cost.step(sequences, tokens, context)
        floor = max(nbytes / bw, flops / (peak * 1e9))
        shape = dict(
            sequences=sequences,
            tokens=tokens,
            bytes=nbytes,
            gflop=flops / 1e9,
            floor_ms=floor * 1e3,
            bound="memory" if nbytes / bw >= flops / (peak * 1e9) else "compute",
            step_ms=seconds * 1e3,
            ratio_to_floor=seconds / floor,
        )
        if runner.packed_linears:
            shape["step_ms_unpacked"] = times[False] * 1e3
        shapes.append(shape)
        work.done(f"{sequences} × {tokens} tokens: {seconds * 1e3:.1f} ms, {seconds / floor:.1f}× its floor")
    one = next(s for s in shapes if (s["sequences"], s["tokens"]) == (1, 1))
    for s in shapes:
        s["ratio_to_one_token_step"] = s["step_ms"] / one["step_ms"]
    result = dict(
        clock=clock,
        packed_linears=runner.packed_linears,
        device=asdict(info) | dict(fast_bf16=info.fast_bf16),
        model=dict(name=model.name, dtype=str(model.dtype).removeprefix("torch."), context=context, **asdict(cost)),
        bandwidth=bandwidth,
        gemm_gflop_s={str(k): v for k, v in gemm.items()},
        gemm_peak_gflop_s=peak,
        shapes=shapes,
    )
    if profile:
        for key, tokens in (("profile_one_token", 1), ("profile_16_tokens", 16)):
            result[key] = profile_step(runner, [Chunk(0, context, prompt[:tokens], tokens)])
            work.done(f"profile of the {tokens}-token step")
    return result


def roofline_lines(result: dict) -> list[str]:
    """A short text summary of the device, the model and each shape's ratio to its floor."""
    d, m, b = result["device"], result["model"], result["bandwidth"]
    lines = [
        f"device: {d['name']} ({d['device']}, {d['threads']} threads, capability {d['cpu_capability']}, "
        f"flags {' '.join(d['flags']) or '-'}; bf16 fast: {'yes' if d['fast_bf16'] else 'no'})",
        f"bandwidth: {b['gemv_gb_s']:.1f} GB/s streaming weights (GEMV), {b['copy_gb_s']:.1f} GB/s copy; "
        f"GEMM peak {result['gemm_peak_gflop_s']:.1f} GFLOP/s ("
        + ", ".join(f"{k} rows {v:.0f}" for k, v in result["gemm_gflop_s"].items())
        + ")",
        f"clock: {result['clock']}; linears packed (oneDNN): {'yes' if result['packed_linears'] else 'no'}",
        f"model: {m['name']} {m['dtype']}, layers {m['layer_bytes'] / 1e6:.0f} MB + LM head {m['head_bytes'] / 1e6:.0f} MB, "
        f"context {m['context']}",
    ]
    for s in result["shapes"]:
        unpacked = f" (linears unpacked: {s['step_ms_unpacked']:.1f} ms)" if "step_ms_unpacked" in s else ""
        lines.append(
            f"{s['sequences']:>2} seq x {s['tokens']:>2} tok: floor {s['floor_ms']:6.1f} ms ({s['bound']}), "
            f"step {s['step_ms']:6.1f} ms = {s['ratio_to_floor']:.2f}x floor, "
            f"{s['ratio_to_one_token_step']:.2f}x one-token step{unpacked}"
        )
    for key in ("profile_one_token", "profile_16_tokens"):
        if key in result:
            top = ", ".join(f"{p['op']} {p['ms_per_step']:.1f} ms" for p in result[key][:6])
            lines.append(f"{key.replace('_', ' ')}: {top}")
    return lines
