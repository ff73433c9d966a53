"""What the device is and what its CPU can do: detected at run time, never assumed."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field

import torch


@dataclass
class DeviceInfo:
    """What the device is and what its CPU can do (detected, not assumed)."""

    device: str
    name: str
    threads: int
    cpu_capability: str  # torch's dispatch level: DEFAULT, AVX2, AVX512, …
    flags: list[str] = field(default_factory=list)  # avx2, avx512f, avx512_bf16, amx_tile, amx_bf16 present

    @property
    def fast_bf16(self) -> bool:
        """bf16 matmuls beat fp32 here: AMX on CPU, any CUDA device."""
        return self.device == "cuda" or "amx_bf16" in self.flags

    @property
    def native_bf16(self) -> bool:
        """bf16 matmuls run on bf16 instructions (AVX-512 BF16, AMX, CUDA); with AVX2 alone torch emulates them,
        ~5x slower than fp32 (a SmolLM2 linear's forward and backward, 2-core AMD EPYC)."""
        return self.fast_bf16 or "avx512_bf16" in self.flags


def detect_device(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        return DeviceInfo("cuda", torch.cuda.get_device_name(device), 0, "cuda")
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    return DeviceInfo(
        "cpu", name, torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(), [f for f in wanted if f in flags]
    )


#: the names ``engine.dtype`` takes (``auto`` resolves by device, see :func:`resolve_engine_dtype`)
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")


def resolve_engine_dtype(name: str, device: torch.device | str, loaded: torch.dtype | None = None) -> torch.dtype:
    """The dtype rollouts run in for ``engine.dtype`` `name` on `device` (shared by every backend).

    ``auto``: bfloat16 on a CUDA GPU that supports it (``torch.cuda.is_bf16_supported``); elsewhere the
    dtype the model was loaded in (`loaded`: float32 from ``load_model``), or float32 when not given. A GPU
    without bfloat16 stays in float32 (float16 overflows on models trained in bfloat16): name float16 to
    choose it. Any other name is that dtype.
    """
    if name not in ENGINE_DTYPES:
        raise ValueError(f"unknown engine dtype {name!r}; choose one of {', '.join(ENGINE_DTYPES)}")
    if name != "auto":
        return getattr(torch, name)
    device = torch.device(device)
    return auto_dtype(device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported(), loaded)


def auto_dtype(gpu_with_bf16: bool, loaded: torch.dtype | None = None) -> torch.dtype:
    """``engine.dtype: auto`` from the device's facts (the rule every backend follows): bfloat16 on a CUDA GPU
    that supports it (the fast dtype differs between CPU and GPU), else `loaded`, or float32 when not given."""
    if gpu_with_bf16:
        return torch.bfloat16
    return loaded if loaded is not None else torch.float32
