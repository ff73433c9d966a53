"""The trainable policy: a causal LM (full fine-tuning or LoRA through peft), an optional value head.

:meth:`Policy.score` runs one packed micro-batch and returns, for each trained token, its log-prob under
``softmax(logits / temperature)`` (the distribution the engine samples from), the entropy and the value
estimate. :meth:`Policy.engine_weights` gives the plain model's weights (LoRA merged) for
``Engine.update_weights``: the engine gets the new policy in memory, with no disk round trip.

Mixed precision keeps float32 master weights (and so float32 AdamW moments) and runs the decoder under
``torch.autocast`` in the compute dtype (``train.dtype: bfloat16``), on CPU and CUDA alike: an update of
lr 1e-6 lands on a float32 weight, where bfloat16's resolution (about 1.2e-4 at 0.02) would round it
away. The LM head and the value head run in the weights' dtype, so log-probs keep float32 precision.
"""

from __future__ import annotations

from contextlib import nullcontext
from copy import deepcopy
from dataclasses import dataclass

import torch

from ..config import ConfigError, EnvConfig, LoraConfig, TrainConfig
from .algorithms import entropy_from_logits
from .batch import MicroBatch

# pyproject.toml has no extra of its own for peft (the `test` extra pins it): the package is named.
PEFT_MISSING = "train.lora.rank > 0 trains LoRA adapters through peft, which is not installed: pip install 'peft>=0.13'"
#: the dtype of the trained weights and so of the optimizer's state, whatever the compute dtype
MASTER_DTYPE = torch.float32


def autocast_dtype(train: TrainConfig) -> torch.dtype | None:
    """The dtype ``train.dtype`` runs the forward and backward passes in under autocast (None: the weights')."""
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
    own copy). `compute_dtype`: the decoder runs under autocast in it (the weights stay in `dtype`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        temperature: float = 1.0,
        lora: LoraConfig | None = None,
        value_head: bool = False,
        dtype: torch.dtype = MASTER_DTYPE,
        copy: bool = True,
        compute_dtype: torch.dtype | None = None,
    ):
        if temperature <= 0:
            raise ValueError("training needs a sampling temperature > 0 (log-probs of a greedy policy are undefined)")
        self.temperature = temperature
        self.dtype = dtype
        self.compute_dtype = compute_dtype if compute_dtype != dtype else None
        self.lora = lora if lora is not None and lora.rank > 0 else None
        require_peft(self.lora)
        shared = not copy and self.lora is None and all(p.dtype == dtype for p in model.parameters())
        base = model if shared else deepcopy(model).to(dtype)
        base.config.use_cache = False
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
        with disable:
            with self._autocast():
                out = self.base.get_decoder()(
                    input_ids=batch.input_ids.to(device),
                    position_ids=batch.position_ids.to(device),
                    attention_mask=self._mask(batch),
                    use_cache=False,
                )
            # The heads run in the weights' dtype: bfloat16 logits would blur every log-prob by ~0.05.
            hidden = out.last_hidden_state[0, batch.targets.to(device)].to(self.dtype)
            logits = self.base.get_output_embeddings()(hidden)
            logits = (logits if logits.dtype == torch.float64 else logits.float()) / self.temperature
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

    def _autocast(self) -> torch.autocast:
        """Autocast to the compute dtype on the weights' device (off without a compute dtype)."""
        enabled = self.compute_dtype is not None
        return torch.autocast(self.device.type, dtype=self.compute_dtype if enabled else None, enabled=enabled)

    def _mask(self, batch: MicroBatch) -> torch.Tensor | None:
        """The micro-batch's mask in the form the model's attention implementation takes."""
        if batch.attention_mask is None:
            return None
        mask = batch.attention_mask.to(self.device)
        if getattr(self.base.config, "_attn_implementation", "sdpa") in ("sdpa", "flex_attention"):
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


def build_policy(config: EnvConfig, model: torch.nn.Module, copy: bool = True):
    """(policy, AdamW, warm-up scheduler, frozen reference or None) for an RL run of `config` on `model`; the
    reference is the start policy when the config has a KL loss or its estimator reads reference log-probs
    (with LoRA the adapters off serve as it); a value head when its estimator needs values.
    ``copy=False``: the policy trains `model` itself where it can (see :class:`Policy`)."""
    train = config.train
    compute = autocast_dtype(train)
    reference = None
    if train.needs_reference and (train.lora is None or train.lora.rank == 0):  # copied before training changes it
        reference = Policy(model, config.sampling.temperature, compute_dtype=compute)
        for p in reference.parameters():
            p.requires_grad_(False)
    policy = Policy(
        model,
        config.sampling.temperature,
        train.lora,
        value_head=train.estimator.needs_values,
        copy=copy,
        compute_dtype=compute,
    )
    optimizer = adamw(policy.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    warmup = train.warmup_steps * train.mini_batches * train.ppo_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup) if warmup else 1.0)
    return policy, optimizer, scheduler, reference


def adamw(params, **options) -> torch.optim.AdamW:
    """AdamW that updates one tensor at a time: the multi-tensor kernel's temporaries hold another copy of
    every trained weight at once (the model's size again at the optimizer step), for no speed on CPU."""
    return torch.optim.AdamW(params, foreach=False, **options)
