"""The trainable policy: a causal LM (full fine-tuning or LoRA through peft), an optional value head.

:meth:`Policy.score` runs one packed micro-batch and returns, for each trained token, its log-prob under
``softmax(logits / temperature)`` (the distribution the engine samples from), the entropy and the value
estimate. :meth:`Policy.engine_weights` gives the plain model's weights (LoRA merged) for
``Engine.update_weights``: the engine gets the new policy in memory, with no disk round trip.

Mixed precision keeps float32 master weights (and so float32 AdamW moments): an update of lr 1e-6 lands on
a float32 weight, where bfloat16's resolution (about 1.2e-4 at 0.02) would round it away. A narrow compute
dtype (``train.dtype: bfloat16``) scores with the engine's numerics (`runner/numerics.py`): the masters
cast to it (as the engine holds them; the cast is differentiable, so gradients reach the masters), a
float32 residual stream with the linears under ``torch.autocast``, and the LM head and the value head in
float32. With ``exact_attention`` (the engine's batch-invariant option) attention runs in float64 as in
the engine. LoRA keeps autocast over the frozen weights (the engine's merged weights differ anyway).
"""

from __future__ import annotations

from contextlib import nullcontext
from copy import deepcopy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import ConfigError, EnvConfig, LoraConfig, TrainConfig
from ..runner.numerics import base_attention, compute, embeddings, is_narrow, use_exact_attention, wide
from .algorithms import entropy_from_logits
from .batch import MicroBatch

# pyproject.toml has no extra of its own for peft (the `test` extra pins it): the package is named.
PEFT_MISSING = "train.lora.rank > 0 trains LoRA adapters through peft, which is not installed: pip install 'peft>=0.13'"
#: the dtype of the trained weights and so of the optimizer's state, whatever the compute dtype
MASTER_DTYPE = torch.float32


def autocast_dtype(train: TrainConfig, engine_dtype: torch.dtype | None = None) -> torch.dtype | None:
    """The dtype ``train.dtype`` computes the forward and backward passes in (None: the weights'); ``auto``:
    the engine's where it is narrow (bfloat16, float16), so both sides compute alike."""
    if train.dtype == "auto":
        return engine_dtype if is_narrow(engine_dtype) else None
    return None if train.dtype == "float32" else getattr(torch, train.dtype)


def require_peft(lora: LoraConfig | None) -> None:
    """A ConfigError, one line naming what to install, when `lora` asks for adapters and peft is missing."""
    if lora is None or lora.rank <= 0:
        return
    try:
        import peft  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "peft":  # peft is there but one of its own imports is missing: that error says which
            raise
        raise ConfigError(PEFT_MISSING) from None


@dataclass
class Scores:
    """Per trained token of a micro-batch."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None


class Policy:
    """A causal LM being trained: its own copy of `model` in `dtype`, or (``copy=False``, full fine-tuning
    in `model`'s dtype) `model` itself, when nothing else runs on it (vLLM serves the rollouts from its
    own copy). `masters`: the weights to start from where `model` no longer holds them at full precision
    (an engine cast it). `compute_dtype`: what the forward and backward passes compute in (the weights
    stay in `dtype`; see the module docstring), `exact_attention`: attention in float64, as the engine's."""

    def __init__(
        self,
        model: torch.nn.Module,
        temperature: float = 1.0,
        lora: LoraConfig | None = None,
        value_head: bool = False,
        dtype: torch.dtype = MASTER_DTYPE,
        copy: bool = True,
        compute_dtype: torch.dtype | None = None,
        exact_attention: bool = False,
        masters: dict[str, torch.Tensor] | None = None,
    ):
        if temperature <= 0:
            raise ValueError("training needs a sampling temperature > 0 (log-probs of a greedy policy are undefined)")
        self.temperature = temperature
        self.dtype = dtype
        self.compute_dtype = compute_dtype if compute_dtype != dtype else None
        self.lora = lora if lora is not None and lora.rank > 0 else None
        require_peft(self.lora)
        shared = (
            not copy and self.lora is None and masters is None and all(p.dtype == dtype for p in model.parameters())
        )
        base = model if shared else deepcopy(model).to(dtype)
        if masters is not None:
            with torch.no_grad():
                base.load_state_dict(masters, strict=True)
        base.config.use_cache = False
        if exact_attention:
            use_exact_attention(base)
        # The masters cast to the compute dtype for every pass, as the engine holds them (full fine-tuning).
        self.cast = is_narrow(self.compute_dtype) and self.lora is None
        if self.lora is not None:
            from peft import LoraConfig as PeftLoraConfig, get_peft_model

            peft_config = PeftLoraConfig(
                r=self.lora.rank,
                lora_alpha=self.lora.alpha,
                target_modules=list(self.lora.target_modules),
                lora_dropout=0.0,
                bias="none",
                task_type="CAUSAL_LM",
            )
            self.model = get_peft_model(base, peft_config)
        else:
            self.model = base
        self.base = base  # the plain HF model (holds the LoRA layers when peft wraps it)
        hidden = base.config.hidden_size
        self.value_head = torch.nn.Linear(hidden, 1, dtype=dtype, device=self.device) if value_head else None
        if self.value_head is not None:
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        self._forward = _Forward(base, self.compute_dtype)
        self.model.train()

    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters (LoRA adapters only, when LoRA is on)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        return params

    def score(self, batch: MicroBatch, entropy: bool = False, reference: bool = False) -> Scores:
        """Log-probs (and entropy, values) of the micro-batch's trained tokens.

        Entropies are differentiable with `entropy=True` (an entropy loss), detached otherwise;
        `reference=True` scores with the LoRA adapters disabled (the frozen starting policy).
        """
        disable = self.model.disable_adapter() if reference and self.lora is not None else nullcontext()
        device = self.device
        inputs = (
            batch.input_ids.to(device),
            batch.position_ids.to(device),
            self._mask(batch),
            batch.targets.to(device),
        )
        with disable:
            if self.cast:
                dtype = self.compute_dtype
                params = {f"base.{n}": p.to(dtype) for n, p in self.base.named_parameters()}
                hidden, logits = torch.func.functional_call(self._forward, params, inputs)
            else:
                hidden, logits = self._forward(*inputs)
            logits = logits / self.temperature
        # log p(token) = logit - logsumexp(logits): no full [tokens, vocab] log-softmax is kept.
        lse = torch.logsumexp(logits, dim=-1)
        token_logp = logits.gather(1, batch.target_ids.to(device).unsqueeze(1)).squeeze(1) - lse
        if entropy:
            ent = entropy_from_logits(logits)
        else:  # a metric only: no graph, in row chunks so no extra [tokens, vocab] tensor lives long
            with torch.no_grad():
                ent = (
                    torch.cat([entropy_from_logits(c) for c in logits.detach().split(256)])
                    if len(logits)
                    else lse.detach()
                )
        values = self.value_head(hidden).squeeze(-1) if self.value_head is not None else None
        return Scores(token_logp, ent, values)

    def _mask(self, batch: MicroBatch) -> torch.Tensor | None:
        """The micro-batch's mask in the form the model's attention implementation takes."""
        if batch.attention_mask is None:
            return None
        mask = batch.attention_mask.to(self.device)
        if base_attention(getattr(self.base.config, "_attn_implementation", None) or "sdpa") in (
            "sdpa",
            "flex_attention",
        ):
            return mask
        dtype = self.compute_dtype or next(self.base.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=self.device).masked_fill(~mask, torch.finfo(dtype).min)

    @property
    def device(self) -> torch.device:
        return next(self.base.parameters()).device

    def engine_weights(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The plain model's state dict (LoRA merged in), detached copies with floating-point tensors in
        `dtype` (the engine's: it receives no wider copy than it keeps)."""

        def copy(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.detach().to(dtype if tensor.is_floating_point() else tensor.dtype, copy=True)

        if self.lora is None:
            return {k: copy(v) for k, v in self.base.state_dict().items()}
        self.model.merge_adapter()
        try:
            state = {}
            for name, tensor in self.base.state_dict().items():
                if "lora_" in name:
                    continue
                state[name.replace(".base_layer.", ".")] = copy(tensor)
            return state
        finally:
            self.model.unmerge_adapter()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything trainable, for checkpoints."""
        state = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        if self.value_head is not None:
            state.update({f"value_head.{k}": v for k, v in self.value_head.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")}, strict=True)
        if self.value_head is not None:
            self.value_head.load_state_dict(
                {k[11:]: v for k, v in state.items() if k.startswith("value_head.")}, strict=True
            )


class _Forward(torch.nn.Module):
    """The policy's pass over a packed micro-batch: the decoder in the compute dtype's numerics, then the LM
    head in float32 (or wider) on the trained rows; (hidden rows, logits)."""

    def __init__(self, base: torch.nn.Module, compute_dtype: torch.dtype | None):
        super().__init__()
        self.base = base
        self.compute_dtype = compute_dtype

    def forward(self, input_ids, position_ids, mask, targets) -> tuple[torch.Tensor, torch.Tensor]:
        decoder, device = self.base.get_decoder(), input_ids.device
        with compute(self.compute_dtype, device.type):
            out = decoder(
                inputs_embeds=embeddings(decoder, input_ids, self.compute_dtype),
                position_ids=position_ids,
                attention_mask=mask,
                use_cache=False,
            )
        hidden = wide(out.last_hidden_state[0, targets])
        head = self.base.get_output_embeddings()
        bias = head.bias if head.bias is None else wide(head.bias)
        return hidden, F.linear(hidden, wide(head.weight), bias)


@dataclass(frozen=True)
class SamplerNumerics:
    """How the rollout engine computes (its dtype; whether its attention is exact, as
    ``engine.batch_invariant`` makes it), which the trainer's passes follow where ``train.dtype`` lets them."""

    dtype: torch.dtype = torch.float32
    exact_attention: bool = False

    def policy_options(self, train: TrainConfig) -> dict:
        """`Policy`'s `compute_dtype` and `exact_attention` for `train`: exact attention where the trainer
        computes in the engine's dtype (elsewhere the two differ anyway)."""
        compute = autocast_dtype(train, self.dtype)
        same = compute == self.dtype if is_narrow(self.dtype) else compute is None
        return {"compute_dtype": compute, "exact_attention": self.exact_attention and same}


#: an engine in float32 without exact attention (what a caller that names none gets)
FLOAT32_SAMPLER = SamplerNumerics()


def master_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights in host memory, taken before an engine casts the module: the float32 masters
    the policy starts from (rounded to the engine's dtype, they would lose what it cannot hold)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def build_policy(
    config: EnvConfig,
    model: torch.nn.Module,
    copy: bool = True,
    sampler: SamplerNumerics = FLOAT32_SAMPLER,
    masters: dict[str, torch.Tensor] | None = None,
):
    """(policy, AdamW, warm-up scheduler, frozen reference or None) for an RL run of `config` on `model`; the
    reference is the start policy when the config has a KL loss or its estimator reads reference log-probs
    (with LoRA the adapters off serve as it); a value head when its estimator needs values.
    ``copy=False``: the policy trains `model` itself where it can (see :class:`Policy`); `sampler`: how the
    engine computes; `masters`: the weights to start from where the engine cast `model` (`master_copy`)."""
    train = config.train
    numerics = sampler.policy_options(train)
    reference = None
    if train.needs_reference and (train.lora is None or train.lora.rank == 0):  # copied before training changes it
        reference = Policy(model, config.sampling.temperature, masters=masters, **numerics)
        for p in reference.parameters():
            p.requires_grad_(False)
    policy = Policy(
        model,
        config.sampling.temperature,
        train.lora,
        value_head=train.estimator.needs_values,
        copy=copy,
        masters=masters,
        **numerics,
    )
    optimizer = adamw(policy.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps * train.mini_batches * train.ppo_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    return policy, optimizer, scheduler, reference


def adamw(params, **options) -> torch.optim.AdamW:
    """AdamW that updates one tensor at a time: the multi-tensor kernel's temporaries hold another copy of
    every trained weight at once (the model's size again at the optimizer step), for no speed on CPU."""
    return torch.optim.AdamW(params, foreach=False, **options)
