"""oneDNN-prepacked linears: same results as nn.Linear (to rounding), same parameters and state dict,
training untouched, and the packed copy follows every in-place weight change."""

from __future__ import annotations

import copy

import pytest
import torch

from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.models import tiny_random_model
from srt_agent.runner.packed_linear import PackedLinear, linear_bytes, pack_model_linears, set_packing

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="hardware: needs oneDNN (mkldnn)")


def test_packed_model_matches_and_keeps_its_state_dict():
    model = tiny_random_model("qwen2", seed=0, dtype=torch.float32).model
    ids = torch.tensor([[5, 17, 33, 2, 99]])
    with torch.no_grad():
        ref = model(ids).logits
    keys = list(model.state_dict())
    assert pack_model_linears(model) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-5, atol=1e-5)
    # Training (gradients on) takes the plain path: the gradient reaches the original weight.
    model.train()
    model(ids).logits.sum().backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad is not None
    assert linear_bytes(model) > 0
    assert pack_model_linears(model) == sum(isinstance(m, PackedLinear) for m in model.modules())  # idempotent


def test_a_copy_of_a_packed_model_is_plain():
    """A trainer's deep copy of the engine's model holds plain nn.Linear modules and no packed weights."""
    model = tiny_random_model("llama", seed=0, dtype=torch.float32).model
    pack_model_linears(model)
    twin = copy.deepcopy(model)
    assert not any(isinstance(m, PackedLinear) for m in twin.modules())
    assert all(not hasattr(m, "_packed") for m in twin.modules())
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(twin(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    assert twin.lm_head.weight is not model.lm_head.weight


def test_packed_copy_follows_weight_updates():
    layer = torch.nn.Linear(16, 8)
    pack_model_linears(torch.nn.Sequential(layer))
    assert isinstance(layer, PackedLinear)
    x = torch.randn(3, 16)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place, as load_state_dict and optimizers do
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        layer.load_state_dict({"weight": torch.randn(8, 16), "bias": torch.zeros(8)})
        torch.testing.assert_close(layer(x), x @ layer.weight.T)
    set_packing(layer, False)
    with torch.no_grad():
        assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_engine_update_weights_reaches_packed_linears():
    """After update_weights, a packed engine decodes exactly what a fresh one over the new weights does."""
    params = SamplingParams(temperature=0.0, max_tokens=8)
    engine = Engine(
        tiny_random_model("llama", seed=0, dtype=torch.float32), EngineOptions(drafter=None, max_context=64)
    )
    assert engine.runner.packed_linears
    engine.generate([[1, 2, 3]], params)
    new = tiny_random_model("llama", seed=5, dtype=torch.float32)
    engine.update_weights(new.model.state_dict())
    fresh = Engine(tiny_random_model("llama", seed=5, dtype=torch.float32), EngineOptions(drafter=None, max_context=64))
    assert engine.generate([[1, 2, 3]], params)[0].token_ids == fresh.generate([[1, 2, 3]], params)[0].token_ids
