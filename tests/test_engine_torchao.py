"""The drafters that cannot run without torchao (the self drafters on CUDA) are refused in one line."""

from __future__ import annotations

import pytest
import torch

from srt_agent.drafting.drafters.self_drafter import SelfDrafter
from srt_agent.models import tiny_random_model
from srt_agent.runner.quantize import check_scheme


@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_the_cuda_self_drafter_without_torchao_is_refused_in_one_line(monkeypatch, scheme):
    """On CUDA the self drafters quantize with torchao; without it the engine refuses at start. The device
    is only named (nothing runs on it), so this holds on a CPU-only machine."""
    import srt_agent.runner.quantize as quantize

    real = quantize.importlib.util.find_spec
    monkeypatch.setattr(quantize.importlib.util, "find_spec", lambda name: None if name == "torchao" else real(name))
    with pytest.raises(ValueError) as err:
        check_scheme(scheme, torch.device("cuda"))
    line = str(err.value)
    assert "\n" not in line and "torchao" in line and "pip install torchao" in line
    model = tiny_random_model("llama", seed=0, dtype=torch.float32).model
    with pytest.raises(ValueError, match="pip install torchao"):
        SelfDrafter(scheme).attach(model, torch.device("cuda"), 1, 32, calibrate=False)


def test_torchao_schemes_quantize_a_bfloat16_copy_whatever_the_engines_dtype():
    """torchao's PerRow fp8 takes bfloat16 input only: a float32 or float16 engine's self drafter quantized
    its float32 copy and failed at start on a GPU with fp8 (sm >= 8.9). Both torchao schemes now cast the copy
    to bfloat16 first; int8 (torch's CPU kernels) stays float32."""
    from srt_agent.runner.quantize import quantized_dtype

    assert quantized_dtype("fp8") == quantized_dtype("int4") == torch.bfloat16
    assert quantized_dtype("int8") == torch.float32
