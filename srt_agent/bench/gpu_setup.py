"""What the GPU check's stages share: the check's config and model shapes, random-weight models of those
shapes and the sharpening that makes their samples repeat, the time budget, and device figures."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..models import LoadedModel

SHARES = {
    "exactness": 0.2,
    "speed": 0.45,
    "train": 0.15,
    "profile": 0.2,
}  # the stages, in order: their share of the time
STAGES = tuple(SHARES)


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2 decoder's shape (random weights are built from it)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = True


QWEN25_1_5B = ModelShape("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936)
QWEN25_0_5B = ModelShape("qwen2.5-0.5b", 896, 24, 14, 2, 4864, 151936)
TINY = ModelShape("tiny-qwen2", 64, 2, 4, 2, 128, 512)
SMALL = ModelShape("small-qwen2", 256, 4, 4, 2, 512, 4096)


@dataclass
class GpuCheckConfig:
    """Sizes of the check; `dry_run` gives the tiny ones."""

    device: str = "auto"
    budget_s: float = 450.0  # all stages together; the device tool stops a command at 600 s
    stages: tuple[str, ...] = STAGES
    seed: int = 0
    exact_archs: tuple[str, ...] = ("llama", "qwen2")
    exact_settings: tuple[str, ...] = ("greedy", "t1-top-p0.9", "t0.7-top-k20")  # gpu_exactness.SETTINGS
    chi_square_samples: int = 1200  # per side of each chi-square test
    shapes: tuple[ModelShape, ...] = (QWEN25_1_5B, QWEN25_0_5B)
    batches: tuple[int, ...] = (1, 16, 64, 256)
    group: int = 8  # samples per prompt (a GRPO group)
    prompt_tokens: int = 32
    max_tokens: int = 64
    max_draft_tokens: int = 16
    target_entropy: float = 0.5  # nats: the sharpened head's mean next-token entropy at T = 1
    drafted_per_sequence: tuple[int, ...] = (4, 8)  # verification shapes timed against a plain step
    train_shape: ModelShape = SMALL
    gap_shape: ModelShape = QWEN25_1_5B  # where the train stage measures the bfloat16 sampler-trainer gap
    profile_batch: int = 64
    threads: int | None = None  # torch's CPU threads (None: torch's choice)

    @classmethod
    def dry_run(cls, device: str = "cpu") -> GpuCheckConfig:
        """Tiny models and workloads: every stage's code path in well under a minute on a CPU."""
        return cls(
            device=device,
            budget_s=300.0,  # a cap, far above the ~40 s it takes: no case is skipped on a busy machine
            exact_archs=("qwen2",),
            exact_settings=("greedy", "t1-top-p0.9"),
            chi_square_samples=600,
            shapes=(TINY,),
            batches=(1, 4),
            group=2,
            prompt_tokens=8,
            max_tokens=8,
            max_draft_tokens=4,
            drafted_per_sequence=(2,),
            train_shape=TINY,
            gap_shape=TINY,
            profile_batch=4,
            threads=1,  # tiny CPU ops: one thread beats several, above all on a shared machine
        )


class Deadline:
    """A point in time a stage must not run past (monotonic clock)."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timings end here); nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_model(shape: ModelShape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> LoadedModel:
    """A random-weight Qwen2 causal LM of `shape`, initialised on `device` (no tokenizer, no end token)."""
    from transformers import AutoModelForCausalLM

    from ..models.architectures import tiny_config

    config = tiny_config(
        "qwen2",
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return LoadedModel(model=model.eval(), tokenizer=None, name=shape.name, source="random", eos_token_ids=[])


def mean_entropy(logits: torch.Tensor) -> float:
    logp = logits.log_softmax(-1)
    return float(-(logp.exp() * logp).sum(-1).mean())


def sharpen_head(model: torch.nn.Module, prompts: list[list[int]], target: float) -> dict:
    """Scale the final norm's weight so the mean next-token entropy at T = 1 over `prompts` is `target` nats
    (bisection on the scale; logits are linear in it). Must run before an engine wraps the model."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(prompts, device=device)).logits.flatten(0, 1).float()
        before = mean_entropy(logits)
        lo, hi = 1e-2, 1e4
        for _ in range(50):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if mean_entropy(mid * logits) > target else (lo, mid)
        scale = (lo * hi) ** 0.5
        model.get_decoder().norm.weight.mul_(scale)
        sharp = model(input_ids=torch.tensor(prompts, device=device)).logits.flatten(0, 1).float()
        top = sharp.softmax(-1).max(-1).values.mean()
    return dict(
        method="final norm weight scaled (the LM head's input), sampling at T=1",
        target_entropy_nats=target,
        scale=scale,
        entropy_before_nats=before,
        entropy_after_nats=mean_entropy(sharp),
        mean_top1_probability=float(top),
    )


def check_outputs(outputs) -> None:
    """Raise on the first request the engine ended with an error: a check over failed requests checks nothing."""
    failed = next((o for o in outputs if o.finish_reason == "error"), None)
    if failed is not None:
        raise RuntimeError(f"request {failed.request_id} failed: {failed.error}")


def memory_figures(device: torch.device) -> dict:
    """Peak memory so far: the device's allocator peak on CUDA, else the process's peak and current RSS."""
    if device.type == "cuda":
        return dict(
            peak_allocated_mb=torch.cuda.max_memory_allocated(device) / 2**20,
            peak_reserved_mb=torch.cuda.max_memory_reserved(device) / 2**20,
        )
    import os
    import resource

    statm = Path("/proc/self/statm")  # Linux: the current resident set in pages
    return dict(
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # the process's lifetime peak
        rss_mb=int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20 if statm.exists() else None,
    )


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
