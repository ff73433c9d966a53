"""The one prompt key: what every holder of trees (our engine's drafters, the vLLM proposer, verl's servers and
affinity router, the OpenAI-compatible server) files a prompt's tree under.

It is a hash of the token ids a trajectory's first turn generates from, so it can be computed from tokens
alone, wherever they are (vLLM's proposer sees no task, only the batch's tokens), GRPO siblings share it,
and trees saved under one backend are found under the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A prompt's key: the hex blake2b (16 bytes) of its token ids as int64."""
    return hashlib.blake2b(np.asarray(prompt_ids, dtype=np.int64).tobytes(), digest_size=16).hexdigest()
