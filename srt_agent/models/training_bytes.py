"""What training a model holds per parameter, in one place: the run's memory plan (`rl/memory.py`) and vLLM's
share of a GPU (`backends/vllm/device_settings.py`) both read it."""

from __future__ import annotations

MASTER_BYTES = 4  # the trained weights are float32 whatever the compute dtype (rl/policy.py)
GRADIENT_BYTES = 4  # float32 gradients of the masters
ADAMW_BYTES = 8  # AdamW's two float32 moments


def trainer_state_bytes(params: int, policy_copy: bool, reference: bool, full_update: bool = True) -> dict[str, int]:
    """The trainer's state for a model of `params` parameters, by part: a float32 policy copied from the loaded
    model (`policy_copy`), a reference policy (`reference`), and with a `full_update` (not LoRA, whose adapters
    are small) the gradients and AdamW's moments of every parameter."""
    parts = {}
    if policy_copy:
        parts["policy (a copy of the model)"] = params * MASTER_BYTES
    if reference:
        parts["reference policy"] = params * MASTER_BYTES
    if full_update:
        parts["gradients"] = params * GRADIENT_BYTES
        parts["AdamW moments"] = params * ADAMW_BYTES
    return parts
