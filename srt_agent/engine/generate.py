"""Batch generation on the engine: every prompt added, the engine stepped until all finish, a progress bar
if asked (:meth:`Engine.generate <srt_agent.engine.engine.Engine.generate>`)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Hashable

from rich.console import Console

from ..console import no_bar, phase_bar
from .interfaces import SteppingEngine
from .params import RequestOutput, SamplingParams


def generate_all(
    engine: SteppingEngine,
    prompts: list[list[int]],
    params: SamplingParams | list[SamplingParams] | None = None,
    prompt_keys: list[Hashable] | None = None,
    progress: bool = False,
) -> list[RequestOutput]:
    """Generate for every prompt on `engine`; a bad prompt yields an "error" output, the others still run."""
    params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
    if len(params_list) != len(prompts) or (prompt_keys is not None and len(prompt_keys) != len(prompts)):
        raise ValueError("params and prompt_keys must have one entry per prompt")
    outputs: dict[str, RequestOutput] = {}
    ids = []
    for i, (prompt, p) in enumerate(zip(prompts, params_list)):
        request_id = f"gen-{uuid.uuid4().hex[:12]}-{i}"
        ids.append(request_id)
        try:
            engine.add_request(prompt, p, request_id, prompt_keys[i] if prompt_keys else None)
        except ValueError as exc:
            outputs[request_id] = RequestOutput(request_id, [], [], "error", error=str(exc))
    phase = functools.partial(phase_bar, Console()) if progress else no_bar
    try:
        with phase("generating", len(prompts)) as update:
            while any(r not in outputs for r in ids):
                for out in engine.step():
                    if out.request_id in ids:
                        outputs[out.request_id] = out
                        update(advance=1)
    finally:
        for request_id in ids:
            engine.release(request_id)
    return [outputs[r] for r in ids]
