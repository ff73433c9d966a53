"""What the host-sync and host-copy tests share: which tensors a torch-function mode treats as device
tensors, and where in the package a counted call came from."""

from __future__ import annotations

import traceback
from collections.abc import Iterator

import torch


def tensors_in(value: object) -> Iterator[torch.Tensor]:
    """Every tensor in `value`, looking into lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def device_arg(args: tuple, kwargs: dict) -> object:
    """The device a ``Tensor.to`` call or a factory names, or None."""
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, (str, torch.device)):
            return value
    return None


def package_line() -> str:
    """``file:line`` of the innermost srt_agent frame on the stack (where a counted call was made)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "srt_agent" in frame.filename:
            return f"{frame.filename.rsplit('srt_agent/', 1)[-1]}:{frame.lineno}"
    return "?"


def runner_state(runner) -> list[torch.Tensor]:
    """A model runner's tensors that live on its device: weights, buffers and the KV cache."""
    model = runner.model
    return [*model.parameters(), *model.buffers(), *runner.kv.keys, *runner.kv.values]
