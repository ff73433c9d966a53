"""Weight-quantized copies of a policy, for drafting with the policy itself.

`quantized_copy(model, scheme)` quantizes a deep copy's ``nn.Linear`` layers, LM head included, except each
MLP's output projection (`keeps_float`: its input's outlier channels cost acceptance); the original is
untouched. Schemes (`SCHEMES`; `default_scheme` picks by device): ``int8`` on CPU (torch's dynamic
quantization, from float32), ``int4`` / ``fp8`` on CUDA (torchao, from a bfloat16 copy whatever the
engine's dtype). Measurements behind these choices: docs/engine.md,
"Drafting with the policy itself".
"""

from __future__ import annotations

import copy
import importlib.util
import warnings

import torch

from .device_info import DeviceInfo

SCHEMES = ("int8", "int4", "fp8")
TORCHAO_MISSING = (
    "the self and srt+self drafters quantize the policy to {scheme} on CUDA with torchao, which is not "
    "installed: pip install torchao (or choose another engine.drafter)"
)
FLOAT_LINEARS = ("down_proj", "mlp.c_proj", "dense_4h_to_h", "fc2", "w2")  # MLP output projections by name


def keeps_float(name: str) -> bool:
    """Whether the linear at module path `name` is an MLP output projection (kept in full precision)."""
    return any(name == suffix or name.endswith("." + suffix) for suffix in FLOAT_LINEARS)


def default_scheme(info: DeviceInfo) -> str:
    """int8 on CPU; on CUDA fp8 where the GPU has fp8 matmuls (compute capability ≥ 8.9), else int4."""
    if info.device != "cuda":
        return "int8"
    return "fp8" if torch.cuda.get_device_capability() >= (8, 9) else "int4"


def quantized_dtype(scheme: str) -> torch.dtype:
    """What a scheme quantizes from: float32 for torch's int8 kernels; bfloat16 for torchao's int4 and fp8
    ones (its PerRow fp8 takes bfloat16 input only, so a float32 or float16 policy's copy is cast first)."""
    return torch.float32 if scheme == "int8" else torch.bfloat16


def check_scheme(scheme: str, device: torch.device) -> None:
    """Raise ValueError when `scheme` cannot run on `device`."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization {scheme!r}; choose one of {', '.join(SCHEMES)} or auto")
    if scheme == "int8" and device.type != "cpu":
        raise ValueError("int8 quantization runs on CPU (fbgemm kernels); use int4 or fp8 on CUDA")
    if scheme == "int8" and "x86" not in torch.backends.quantized.supported_engines:
        raise ValueError("this PyTorch build has no x86/fbgemm quantized kernels for int8 drafting")
    if scheme != "int8" and device.type != "cuda":
        raise ValueError(f"{scheme} quantization needs a CUDA device")
    if scheme != "int8" and importlib.util.find_spec("torchao") is None:
        raise ValueError(TORCHAO_MISSING.format(scheme=scheme))


@torch.no_grad()
def quantized_copy(model: torch.nn.Module, scheme: str) -> torch.nn.Module:
    """A copy of `model` whose linears (but the MLP output projections) are quantized by `scheme`."""
    clone = copy.deepcopy(model).eval().requires_grad_(False)
    names = {n for n, m in clone.named_modules() if isinstance(m, torch.nn.Linear) and not keeps_float(n)}
    if scheme == "int8":
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        with (
            warnings.catch_warnings()
        ):  # torch.ao.quantization is deprecated; its CPU kernels are still the fastest here
            warnings.simplefilter("ignore")
            quantize_dynamic(
                clone.to(quantized_dtype(scheme)), {n: per_channel_dynamic_qconfig for n in names}, inplace=True
            )
        return clone
    try:
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            Int4WeightOnlyConfig,
            PerRow,
            quantize_,
        )
    except ImportError as exc:  # check_scheme refuses a missing torchao; this one lacks the API used here
        raise ValueError(
            f"the {scheme} drafter needs torchao's quantization API (pip install -U torchao): {exc}"
        ) from None
    clone.to(quantized_dtype(scheme))
    if scheme == "int4":
        config = Int4WeightOnlyConfig(group_size=128)
    else:
        config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    quantize_(clone, config, filter_fn=lambda _module, name: name in names)
    return clone
