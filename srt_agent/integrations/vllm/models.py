"""Model directories vLLM can load, for this project's model specs.

``smollm2`` (and any ``.gguf``) goes through :mod:`srt_agent.models`' cached float32 conversion, an HF
directory is used as it is, and ``tiny-<arch>`` becomes a small random model saved once under the user
cache directory with SmolLM2's tokenizer (a real vocabulary, so prompts are text).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ...models import EMBEDDED_NAME, TINY_PREFIX, _hf_dir_for, cache_root, load_tokenizer, tiny_random_model

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
        arch, hidden_size=TINY_HIDDEN, num_layers=num_layers, num_heads=TINY_HEADS, num_kv_heads=TINY_HEADS // 2,
        seed=seed, dtype=torch.float32, tokenizer=tokenizer,
    )
    with torch.no_grad():
        loaded.model.get_output_embeddings().weight.mul_(logit_scale)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        loaded.model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process saved it first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
