"""Device → host syncs per engine step, counted on the CPU.

A read of device memory from the host (``.item()``, ``.tolist()``, ``bool(t)``, ``.cpu()``, a boolean-mask
index, ...) waits for everything queued on a GPU: a step that does it per tree level or per row stalls the
device many times. The test runs engine steps on a tiny random model under a torch-function mode that
tracks which tensors would live on the device (the model's weights and buffers, the KV cache, tensors made
for or moved to a device, and every tensor computed from them; tensors the host builds without naming a
device stay host tensors) and counts each host read of such a tensor.

Budget: one read per engine step, the verifier's single transfer of every candidate row's token,
log-probability and non-finite flag (`verification.py`), as long as the candidate rows fit its eager path
(a level-by-level walk of very large trees reads once per level; a top-p nucleus wider than the tokens
first sorted costs one more read). Nothing else in a step reads the device: the scheduler, the drafters
and the bookkeeping work on host values. Measured here with SRT drafting at T = 1, top-k 20, top-p 0.9,
on the code before this budget (9604cb3): 6 reads per tree level walked (the non-finite check, three in
``filter_logits``, two ``tolist`` in ``sample_rows``), so 30 to 54 in steps that walk trees 5 to 9 levels
deep, 76 to 86 with SPEC-RL's lenient drafts (one more per judged token) and 6 in a plain decode step.
Now: 1 in every step.
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

from srt_agent.drafting import make_drafter
from srt_agent.engine import Engine, EngineOptions, SamplingParams, verification
from srt_agent.models import tiny_random_model
from srt_agent.runner.device_info import DeviceInfo

pytestmark = pytest.mark.usefixtures("one_thread")

STEP_BUDGET = 1
READS = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "equal", "nonzero"}
MASKED = {"__getitem__", "__setitem__", "index_put_", "masked_select"}  # a boolean index's size is data


class HostReads(TorchFunctionMode):
    """Counts host reads of device tensors, by the engine source line that made them.

    Device tensors: the given ones, every tensor computed from one, and tensors made with an explicit
    device (``torch.tensor(..., device=d)``, ``t.to(d)``) that is not the string ``"cpu"``. Downloads:
    the reads in READS, boolean-mask indexes, and ``.to("cpu")``. On the CPU ``t.to(d)`` returns ``t``
    itself; here it returns a copy, as on a GPU, so the host tensor stays a host tensor.
    """

    def __init__(self, device_tensors: list[torch.Tensor]):
        super().__init__()
        self.on_device = WeakIdKeyDictionary({t: True for t in device_tensors})
        self.sites: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tainted = any(t in self.on_device for t in tensors_in((args, kwargs)))
        device = device_arg(args, kwargs) if name in ("to", "cuda") or "device" in kwargs else None
        if tainted and self._reads(name, args, device):
            self.sites[f"{name} at {package_line()}"] += 1
        out = func(*args, **kwargs)
        upload = not tainted and device is not None and device != "cpu"
        if upload and name == "to" and out is args[0]:
            out = out.clone()
        if tainted or upload:
            for t in tensors_in(out):
                self.on_device[t] = True
        if tainted and (name.endswith("_") or name == "__setitem__"):
            self.on_device[args[0]] = True
        if tainted:
            for t in tensors_in(kwargs.get("out")):
                self.on_device[t] = True
        return out

    def _reads(self, name: str, args: tuple, device: object) -> bool:
        if name in READS or (name == "to" and device == "cpu"):
            return True
        index = args[1:2] if name != "masked_select" else args[1:]
        return name in MASKED and any(t.dtype == torch.bool and t in self.on_device for t in tensors_in(index))


@contextlib.contextmanager
def counting(engine: Engine) -> Iterator[HostReads]:
    with HostReads(runner_state(engine.runner)) as reads:
        yield reads


def speculative_engine(dtype: torch.dtype, drafter: str) -> Engine:
    return Engine(
        tiny_random_model("llama", seed=0, dtype=dtype),
        EngineOptions(
            drafter=make_drafter(drafter),
            max_batch=8,
            max_context=96,
            max_draft_tokens=8,
            adaptive_drafts=False,
            calibrate=False,
        ),
    )


PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [1, 2, 3], [4, 5, 6, 7]]


def params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=24, seed=100 + i, temperature=1.0, top_k=20, top_p=0.9) for i in range(4)]


def counted_steps(engine: Engine) -> list[tuple[int, dict[str, int], int]]:
    """A second round over PROMPTS (the first filled the drafter), plus a new prompt that joins while the
    others verify drafts: per step, the host reads, where they happened, and the deepest walk (levels)."""
    engine.generate(PROMPTS, params())
    engine.end_step()
    for prompt, sampling in zip(PROMPTS, params()):
        engine.add_request(prompt, sampling)
    walked: list[int] = []
    verify = engine.verifier.forward_and_verify

    def recording(*args):
        emitted, accepted, faults = verify(*args)
        walked.append(max(len(a) for a in accepted) + 1)
        return emitted, accepted, faults

    engine.verifier.forward_and_verify = recording
    steps = []
    while engine.has_unfinished():
        if len(steps) == 1:
            engine.add_request([9, 8, 7, 6, 5], params()[0])
        with counting(engine) as reads:
            engine.step()
        steps.append((sum(reads.sites.values()), dict(reads.sites), walked[-1]))
    return steps


@pytest.mark.parametrize("drafter", ["srt", "spec-rl"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_an_engine_step_reads_the_device_once(dtype, drafter):
    """Steps that prefill, verify draft trees (exact ones, and SPEC-RL's judged leniently) and decode at
    T = 1 with top-k and top-p each read device memory once."""
    engine = speculative_engine(dtype, drafter)
    steps = counted_steps(engine)
    assert engine.stats()["draft_accepted"] > 0 and max(levels for _, _, levels in steps) > 2
    for count, sites, _ in steps:
        assert count <= STEP_BUDGET, sites


def test_a_level_by_level_walk_reads_once_per_level():
    """Trees past the eager path's size are walked level by level: one read per level walked."""
    engine = speculative_engine(torch.float32, "srt")
    engine.verifier.eager_rows = 0
    steps = counted_steps(engine)
    assert max(levels for _, _, levels in steps) > 2
    for count, sites, levels in steps:
        assert count <= levels, sites


def test_the_cut_off_is_the_devices_and_a_gpu_verifies_the_main_jobs_shape_in_one_read():
    """On a CPU the eager path stops at 64 rows (extra rows' logits are wasted work there); on a GPU every row
    of the main job's shape (16 sequences × a 16-node draft and its root) goes in one pass and one read, at
    SmolLM2's vocabulary and at Qwen2.5's. Run here on the CPU with the GPU's cut-off."""
    cpu, gpu = DeviceInfo("cpu", "x86", 2, "AVX2"), DeviceInfo("cuda", "H100", 0, "cuda")
    assert verification.eager_logits_rows(cpu, 151936) == verification.CPU_EAGER_ROWS == 64
    assert verification.eager_logits_rows(gpu, 49152) >= verification.eager_logits_rows(gpu, 151936) >= 16 * 17
    engine = Engine(
        tiny_random_model("llama", seed=0, dtype=torch.float32),
        EngineOptions(
            drafter=make_drafter("srt"),
            max_batch=16,
            max_context=96,
            max_draft_tokens=16,
            adaptive_drafts=False,
            calibrate=False,
        ),
    )
    engine.verifier.eager_rows = verification.eager_logits_rows(gpu, engine.runner.vocab_size)
    prompts = [[1 + i % 4, 2, 3] for i in range(16)]
    sampling = [SamplingParams(max_tokens=24, seed=7 + i, temperature=1.0) for i in range(16)]
    engine.generate(prompts, sampling)  # the trees learn the prompts' continuations
    engine.end_step()
    for prompt, p in zip(prompts, sampling):
        engine.add_request(prompt, p)
    widest = 0
    while engine.has_unfinished():
        before = engine.stats()["draft_verified"]
        with counting(engine) as reads:
            engine.step()
        widest = max(widest, engine.stats()["draft_verified"] - before)
        assert sum(reads.sites.values()) <= STEP_BUDGET, reads.sites
    assert widest > verification.CPU_EAGER_ROWS  # steps the CPU's cut-off would have walked level by level


def test_the_counter_sees_reads_of_device_tensors_only():
    """Host tensors are free to read; a device tensor's reads and boolean indexes count, by source line."""
    weight = torch.ones(3)
    host = torch.tensor([1.0, 2.0])
    with HostReads([weight]) as reads:
        derived = weight * 2
        bool(host.any())
        host.tolist()
        derived.tolist()
        float(derived.sum())
        derived[derived > 1]
        derived.to("cpu")
        derived.to(torch.float64)
        uploaded = host.to(weight.device)
        int(uploaded[0])
        host.tolist()
    assert sum(reads.sites.values()) == 5
