"""oneDNN-prepacked linear layers for CPU inference, swapped into a model without changing its weights.

`pack_model_linears(model)` turns the model's ``nn.Linear`` modules into :class:`PackedLinear`: the same
module (same parameters, same state-dict keys, same training behaviour) that, when no gradient is
needed, multiplies by a copy of its weight reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``), which skips the per-call
packing the plain kernel does. A single row keeps the plain kernel (why: docs/engine.md, "Prepacked
linears"). The copy follows the weight: any in-place change (``load_state_dict``,
an optimizer step) bumps the weight's version counter and the next call re-packs. The price is a
second copy of the linear weights in memory, so `should_pack` only says yes when that fits easily.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F

PACK_ROWS_HINT = 16  # oneDNN picks the blocked layout for this many rows (a verification step's size)


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose inference calls use a oneDNN-packed copy of the weight."""

    _packed: torch.Tensor | None
    _packed_version: int
    packing: bool  # False: behave exactly as nn.Linear (for side-by-side measurements)

    def __deepcopy__(self, memo: dict) -> torch.nn.Linear:
        """A copy is a plain ``nn.Linear`` (e.g. a trainer's own copy of the policy): the packed
        weights belong to the module the engine runs, and copying them would double its memory."""
        plain = torch.nn.Linear.__new__(torch.nn.Linear)
        memo[id(self)] = plain
        state = {k: v for k, v in self.__dict__.items() if k not in ("_packed", "_packed_version", "packing")}
        plain.__dict__.update(copy.deepcopy(state, memo))
        return plain

    def repack(self) -> None:
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS_HINT)
        self._packed_version = self.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type == "cpu"
            and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == self.weight.dtype
        ):
            x = x.to(self.weight.dtype)  # what autocast would hand the plain kernel (a narrow model's float32 stream)
        if not self.packing or torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[0] == 1:  # one row: the plain matrix-vector kernel measured faster
            return F.linear(x, self.weight, self.bias)
        if self._packed is None or self._packed_version != self.weight._version:
            self.repack()
        out = torch.ops.mkldnn._linear_pointwise(flat, self._packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])


def pack_model_linears(model: torch.nn.Module) -> int:
    """Make every ``nn.Linear`` of `model` a :class:`PackedLinear` (in place, idempotent: engines may
    share a model); returns how many packed linears the model has."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = PackedLinear
            module._packed = None
            module.repack()
    set_packing(model, True)
    return sum(isinstance(m, PackedLinear) for m in model.modules())


def set_packing(model: torch.nn.Module, enabled: bool) -> None:
    """Turn the packed path of every PackedLinear in `model` on or off."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.packing = enabled


def linear_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights of the model's ``nn.Linear`` modules (shared weights counted once)."""
    seen = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in seen.values())


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def should_pack(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, fast_bf16: bool) -> bool:
    """Pack on CPU with oneDNN, for float32 (and bfloat16 where the CPU has AMX), when the packed copy
    takes at most a quarter of the available memory. ``SRT_AGENT_PACK_LINEARS=0|1`` overrides."""
    forced = os.environ.get("SRT_AGENT_PACK_LINEARS")
    if forced in ("0", "1"):
        return forced == "1" and device.type == "cpu" and torch.backends.mkldnn.is_available()
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype != torch.float32 and not (dtype == torch.bfloat16 and fast_bf16):
        return False
    available = available_memory_bytes()
    return available is not None and linear_bytes(model) <= available // 4
