"""One set of numerics for a model's forward pass, shared by the engine (sampling) and the trainer (scoring).

**Narrow weights** (bfloat16, float16) compute with a float32 residual stream: the input embeddings are
upcast, every linear layer runs in the weights' dtype under ``torch.autocast`` (its input rounded to it),
norms, rotary embeddings and residual adds stay in float32, and the LM head runs in float32 on the float32
hidden state and the upcast weight, so the log-softmax sees float32 logits (bfloat16 logits would blur every
log-probability by ~0.03). The engine computes so over its narrow weights; the trainer over its float32
master weights cast to the same dtype, so a sampled token's log-probability and the trainer's come from the
same recipe.

**Exact attention** (the batch-invariant option): attention runs in float64 on its inputs rounded to the
dtype the KV cache holds, and its output is rounded back. A float32 attention's result depends on the order
of its sums (the batch, the padding, the draft tree, whether a position was decoded or scored in one pass);
rounded to bfloat16 that error flips the last bit of some activations, and 30 layers amplify the flips into
log-probabilities that differ by ~1e-2. Float64's order-dependent error sits ~2^29 below float32's, so the
rounded output is the same bits whatever the order. Together with matrix multiplies that give each row the
same bits whatever the number of rows (probed: `linears_batch_invariant`), a position's logits are then the
same in every batch, in the engine and in the trainer. Why and what it costs: docs/engine.md, "Numerics".
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

NARROW = (torch.bfloat16, torch.float16)
EXACT_PREFIX = "srt_exact_over_"
PROBE_ROWS = (1, 3, 16, 67, 272)
PROBED_LINEARS = 7  # the first layer's (attention and MLP projections of a Llama-like layer)  # row counts a linear must give the same bits for (272: 16 rows x 17 nodes)


def is_narrow(dtype: torch.dtype | None) -> bool:
    """Whether weights of `dtype` compute with a float32 residual stream (see the module docstring)."""
    return dtype in NARROW


def plain_linears(model: torch.nn.Module) -> bool:
    """Whether every linear layer of `model` holds a plain tensor (not a quantized one, which runs as it is)."""
    return all(type(m.weight.data) is torch.Tensor for m in model.modules() if isinstance(m, torch.nn.Linear))


def compute(dtype: torch.dtype | None, device_type: str) -> contextlib.AbstractContextManager:
    """The context a forward pass over weights of `dtype` runs in: autocast to it where it is narrow."""
    return torch.autocast(device_type, dtype=dtype) if is_narrow(dtype) else contextlib.nullcontext()


def embeddings(decoder: torch.nn.Module, input_ids: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The decoder's input embeddings of `input_ids`, upcast to float32 where `dtype` is narrow."""
    out = decoder.get_input_embeddings()(input_ids)
    return out.float() if is_narrow(dtype) else out


def wide(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` in float32 where it is narrow (float64 stays float64)."""
    return tensor.float() if is_narrow(tensor.dtype) else tensor


def exact_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None,
    store: torch.dtype,
) -> torch.Tensor:
    """Scaled dot-product attention in float64 on `q`, `k`, `v` rounded to `store`, rounded back to `store`
    (`mask`: boolean, or additive 0 / -inf)."""
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (t.to(store).double() for t in (q, k, v))
        if mask is not None and mask.is_floating_point():
            mask = mask.double()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).to(store)


def base_attention(name: str) -> str:
    """The attention implementation under srt-agent's wrappers (``srt_tree_over_sdpa`` → ``sdpa``)."""
    return name.rsplit("_over_", 1)[-1]


def base_attention_function(module: torch.nn.Module):
    """The attention function of `module`'s model under srt-agent's wrappers (each modeling file has its own
    eager function)."""
    from transformers import AttentionInterface

    name = base_attention(module.config._attn_implementation)
    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return AttentionInterface._global_mapping[name]


def exact_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: the model's own implementation, run in float64 on its inputs
    rounded to the attention weights' dtype (what the engine's KV cache holds), its output rounded back."""
    store = module.o_proj.weight.dtype if hasattr(module, "o_proj") else next(module.parameters()).dtype
    function = base_attention_function(module)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.double()
    with torch.autocast(query.device.type, enabled=False):
        q, k, v = (t.to(store).double() for t in (query, key, value))
        out, _ = function(module, q, k, v, attention_mask, **kwargs)
    return out.to(store), None


def wrap_attention(model: torch.nn.Module, prefix: str, function) -> None:
    """Route `model`'s attention through `function`, registered with transformers as `prefix` + the current
    implementation (with that implementation's mask function); nothing when it already runs under `prefix`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    current = model.config._attn_implementation or "eager"
    if current.startswith(prefix):
        return
    name = prefix + current
    AttentionInterface.register(name, function)
    mask_function = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(base_attention(current))
    if mask_function is not None:
        AttentionMaskInterface.register(name, mask_function)
    model.set_attn_implementation(name)


def use_exact_attention(model: torch.nn.Module) -> None:
    """Route `model`'s attention (outside the engine's passes) through :func:`exact_attention`."""
    wrap_attention(model, EXACT_PREFIX, exact_attention)


@torch.no_grad()
def linears_batch_invariant(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether the model's linear layers give every row the same bits whatever the number of rows, on the
    module as the engine runs it and on a plain ``F.linear`` as the trainer does (probed on the first
    decoder layer's linears with `PROBE_ROWS` rows, under the weights' numerics; False without linears)."""
    linears = [m for m in model.get_decoder().modules() if isinstance(m, torch.nn.Linear)][:PROBED_LINEARS]
    if not linears:
        return False
    generator = torch.Generator(device="cpu").manual_seed(0)
    for linear in linears:
        dtype = linear.weight.dtype
        x = torch.randn(max(PROBE_ROWS), linear.in_features, generator=generator)
        x = x.to(device, torch.float32 if is_narrow(dtype) else dtype)  # as the pass feeds it
        with compute(dtype, device.type):
            reference = F.linear(x[:1], linear.weight, linear.bias)
            for rows in PROBE_ROWS:
                for out in (linear(x[:rows]), F.linear(x[:rows], linear.weight, linear.bias)):
                    if not torch.equal(out[:1], reference):
                        return False
    return True


def choose_exact_attention(setting: bool | str, model: torch.nn.Module, device: torch.device) -> bool:
    """``engine.batch_invariant``: True or False as given; ``auto``: on a CPU whose linears pass
    :func:`linears_batch_invariant` (a GPU's matrix multiplies pick kernels by shape: exact attention alone
    would buy nothing there)."""
    if setting != "auto":
        return bool(setting)
    return device.type == "cpu" and linears_batch_invariant(model, device)
