"""Model directories vLLM can load, for this project's model specs.

``smollm2`` (and any ``.gguf``) goes through :mod:`srt_agent.models`' cached float32 conversion, an HF
directory is used as it is, and ``tiny-<arch>`` becomes a small random model saved once under the user
cache directory with SmolLM2's tokenizer (a real vocabulary, so prompts are text).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ...files.atomic import atomic_folder
from ...models.loading import (
    EMBEDDED_NAME,
    TINY_PREFIX,
    _hf_dir_for,
    cache_root,
    load_tokenizer,
    save_model,
    tiny_random_model,
)

# vLLM's CPU attention supports head sizes 32, 64, 80, …: hidden 128 over 4 heads gives 32.
TINY_HIDDEN = 128
TINY_HEADS = 4
# The output layer is scaled by this (on top of tiny_random_model's sharpening) so that a few tokens take
# most of the mass at temperature 1: sampling repeats itself enough for drafts to be accepted, and a
# distribution test over the first tokens has cells with real counts.
TINY_LOGIT_SCALE = 6.0


def vllm_model_dir(spec: str = EMBEDDED_NAME) -> Path:
    """An HF model directory for vLLM: ``smollm2``, a ``.gguf`` file, an HF directory or ``tiny-<arch>``."""
    if spec.startswith(TINY_PREFIX):
        return tiny_model_dir(spec.removeprefix(TINY_PREFIX))
    return _hf_dir_for(spec)[0]


def tiny_model_dir(
    arch: str = "llama", num_layers: int = 2, seed: int = 0, logit_scale: float = TINY_LOGIT_SCALE
) -> Path:
    """A float32 random ``arch`` model with SmolLM2's tokenizer, saved once (atomically) in the cache."""
    tag = hashlib.sha256(repr((arch, TINY_HIDDEN, TINY_HEADS, num_layers, seed, logit_scale)).encode()).hexdigest()[:12]
    target = cache_root() / "vllm-models" / f"tiny-{arch}-{tag}"
    if (target / "config.json").exists():
        return target
    tokenizer = load_tokenizer(EMBEDDED_NAME)
    loaded = tiny_random_model(
        arch,
        hidden_size=TINY_HIDDEN,
        num_layers=num_layers,
        num_heads=TINY_HEADS,
        num_kv_heads=TINY_HEADS // 2,
        seed=seed,
        dtype=torch.float32,
        tokenizer=tokenizer,
    )
    with torch.no_grad():
        loaded.model.get_output_embeddings().weight.mul_(logit_scale)
    return _saved(loaded, target)


def _saved(loaded, target: Path) -> Path:
    """Save `loaded`'s model and tokenizer as an HF directory at `target`, atomically (once)."""
    with atomic_folder(target, replace=False) as tmp:  # another process may save it first: theirs stays
        save_model(loaded.model, tmp)
        loaded.tokenizer.save_pretrained(tmp)
    return target


VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def unservable(loaded) -> str | None:
    """Why vLLM cannot serve `loaded` here (a CPU model whose attention head size vLLM's CPU kernels lack),
    or None."""
    config = loaded.model.config
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    on_cpu = next(loaded.model.parameters()).device.type == "cpu"
    if on_cpu and head not in VLLM_CPU_HEAD_SIZES:
        return (
            f"vLLM's CPU attention runs head sizes {VLLM_CPU_HEAD_SIZES}; {loaded.name} has {head} "
            "(use a model directory, e.g. srt_agent.backends.vllm.tiny_model_dir())"
        )
    return None


def loaded_model_dir(loaded) -> Path:
    """An HF directory holding exactly `loaded`'s weights (saved once per content, under the user cache),
    for a model that was not loaded from one (e.g. ``tiny-<arch>``): vLLM must serve the policy the
    trainer trains, not another random model of the same name."""
    problem = unservable(loaded)
    if problem is not None:
        raise ValueError(problem)
    digest = hashlib.sha256()
    for name, tensor in sorted(loaded.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    target = cache_root() / "vllm-models" / f"{loaded.name}-{digest.hexdigest()[:12]}"
    if (target / "config.json").exists():
        return target
    return _saved(loaded, target)
