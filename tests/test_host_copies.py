"""Host → device copies per forward pass of the model runner, counted on the CPU.

Every small tensor a pass builds on the host and sends over costs a transfer on a GPU (a launch, a
staging copy, often a wait). The runner builds a pass's integer inputs (token ids, positions, cache
slots and positions, the tree's ancestor intervals, the attention groups' rows) as one host buffer and
moves it in one copy; the attention masks are derived from it on the device.

Method: the test runs passes of a tiny random model under a torch-function mode that tracks which tensors
would live on the device: the model's weights and buffers, the KV cache, tensors made with an explicit
device that is not the string ``"cpu"``, and every tensor computed from one of those. Tensors the host
builds from Python values stay host tensors. It counts each upload: ``torch.tensor`` / ``as_tensor`` of
Python data with an explicit device, ``.to(device)`` / ``.cuda()`` of a host tensor, an in-place copy of
a host tensor into a device tensor, an operation that mixes a host tensor of one or more dimensions
with device tensors (a GPU copies it over implicitly), and indexing a device tensor with a Python list.
On the CPU ``t.to(d)`` returns ``t`` itself; here it returns a copy, as on a GPU, so the host tensor
stays a host tensor.

Budget: one copy per forward pass (``ModelRunner.forward``), none for the LM head (``logits``), one per
KV compaction (``move_kv``). Measured on the code before this budget (9604cb3): 10 copies for a pass of
one group of chunks, 16 for a pass of two groups (token ids, slots, cache positions, positions, and per
group rows, packed rows, slots, mask, query and key positions, plus the real rows when padded), each of
them blocking, and 3 per compaction.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import pytest
import torch
from helpers.device_tracking import device_arg, package_line, runner_state, tensors_in
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from srt_agent.models import tiny_random_model
from srt_agent.runner.model_runner import Chunk, ModelRunner

pytestmark = pytest.mark.usefixtures("one_thread")

PASS_BUDGET = 1
DATA_FACTORIES = {"tensor", "as_tensor", "asarray", "from_numpy"}
INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}


def _has_list(value: object) -> bool:
    """A Python list inside an index (``t[[1, 2]]``, ``t[a, [1, 2]]``): a GPU copies it over as a tensor."""
    return isinstance(value, list) or (isinstance(value, tuple) and any(isinstance(v, list) for v in value))


class HostToDevice(TorchFunctionMode):
    """Counts uploads (see the module docstring) by the source line in the package that made them."""

    def __init__(self, device_tensors: list[torch.Tensor]):
        super().__init__()
        self.on_device = WeakIdKeyDictionary({t: True for t in device_tensors})
        self.sites: collections.Counter[str] = collections.Counter()

    @property
    def count(self) -> int:
        return sum(self.sites.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = list(tensors_in((args, kwargs)))
        device_in = [t for t in tensors if t in self.on_device]
        host_in = [t for t in tensors if t not in self.on_device and t.dim() > 0]
        device = device_arg(args, kwargs) if name in ("to", "cuda") or "device" in kwargs else None
        named = device is not None and device != "cpu"
        in_place = name.endswith("_") or name == "__setitem__"
        target_on_host = in_place and bool(tensors) and args[0] not in self.on_device
        if self._uploads(name, args, named, device_in, host_in, tensors) and not target_on_host:
            self.sites[f"{name} at {package_line()}"] += 1
        out = func(*args, **kwargs)
        if named and name in ("to", "cuda") and out is args[0]:
            out = out.clone()
        if device_in or named:
            for t in tensors_in(out):
                self.on_device[t] = True
            if in_place and not target_on_host:
                self.on_device[args[0]] = True
        return out

    @staticmethod
    def _uploads(name: str, args: tuple, named: bool, device_in: list, host_in: list, tensors: list) -> bool:
        if named and name in DATA_FACTORIES | {"to", "cuda"}:
            return not device_in and (name in DATA_FACTORIES or bool(tensors))
        if device_in and host_in:
            return True
        return bool(device_in) and name in INDEXING and len(args) > 1 and _has_list(args[1])


@contextlib.contextmanager
def counting(runner: ModelRunner, *outputs: torch.Tensor) -> Iterator[HostToDevice]:
    """Count while the runner's state (and earlier `outputs` of it) live on the device."""
    with HostToDevice([*runner_state(runner), *outputs]) as copies:
        yield copies


def passes() -> list[list[Chunk]]:
    """A prefill of two sequences in two length groups, a verification of a draft tree beside a decode
    step, and one sequence's decode step."""
    return [
        [Chunk(0, 0, list(range(1, 13)), 12), Chunk(2, 0, [7, 8, 9], 3)],
        [Chunk(0, 12, [5, 10, 11, 12, 13, 14, 15], 1, [-1, -1, 0, 0, 3, 1]), Chunk(2, 3, [4], 1)],
        [Chunk(2, 4, [6], 1)],
    ]


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_oss"])
def test_a_forward_pass_copies_to_the_device_once(arch):
    """Prefill, tree verification and decode passes each upload one buffer; the LM head none. Gemma 2
    (soft-capping, sliding windows) and gpt-oss (sinks, sliding windows) take the written-out attention."""
    runner = ModelRunner(
        tiny_random_model(arch, seed=0).model, 3, max_context=32, tree_margin=8, device=torch.device("cpu")
    )
    for chunks in passes():
        with counting(runner) as copies:
            hidden = runner.forward(chunks)
        assert copies.count <= PASS_BUDGET, dict(copies.sites)
        with counting(runner, hidden) as copies:
            runner.logits(hidden)
        assert copies.count == 0, dict(copies.sites)
    with counting(runner) as copies:
        runner.move_kv([0, 0], [13, 15], [12, 13])
    assert copies.count <= 1, dict(copies.sites)


def test_the_counter_sees_uploads_only():
    """Host work is free and device work is free; each way of moving host data over counts once."""
    weight = torch.ones(4)
    host = torch.tensor([0, 2])
    with HostToDevice([weight]) as copies:
        host = host + 1  # host arithmetic
        derived = weight * 2  # device arithmetic
        torch.zeros(2, device=torch.device("cpu"))  # made on the device
        torch.tensor([1, 2], device=torch.device("cpu"))  # 1: Python data to the device
        index = host.to(weight.device)  # 2
        derived[index]  # device index: free
        derived[host]  # 3: host index into a device tensor
        derived[[0, 1]]  # 4: a Python list index
        derived[:2].copy_(host)  # 5
        derived * 2.0
        derived.tolist()
        host[0] = derived[1]  # a download, not an upload
    assert copies.count == 5, dict(copies.sites)
