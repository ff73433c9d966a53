"""A decode step's cost on a GPU this machine does not have, from the roofline: the model shape's bytes and FLOPs
for the step's rows (each feeding its tokens after its cached context) against the device's HBM bandwidth and
dense bf16 peak, plus a fixed cost per step and the drafter's host time per row.

``seconds = fixed + max(bytes / (bandwidth * memory_efficiency), flops / (peak * compute_efficiency))``, where
the bytes are the decoder and LM-head weights (read once per step) and every row's keys and values, and the
FLOPs are two per parameter per fed token plus attention's over each row's keys. What this assumes and cannot
know: docs/benchmarks/projection.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = Path(__file__).with_name("qwen2.5-1.5b.json")  # Qwen2.5-1.5B's config.json numbers
MEMORY_EFFICIENCY = 0.8  # the share of HBM bandwidth decode kernels reach
COMPUTE_EFFICIENCY = 0.6  # the share of the dense peak small-row GEMMs reach
FIXED_S = 1e-3  # per step outside the kernels: scheduling, sampling, launches (CUDA graphs assumed)


@dataclass(frozen=True)
class GPU:
    """A device: HBM bandwidth (GB/s) and dense bf16 tensor-core peak (TFLOP/s), from the vendors' data sheets."""

    name: str
    bandwidth_gb_s: float
    bf16_tflops: float


DEVICES = {
    "H100": GPU("H100", 3350, 989),  # SXM5, 80 GB HBM3
    "H200": GPU("H200", 4800, 989),  # SXM, 141 GB HBM3e
    "A100": GPU("A100", 2039, 312),  # SXM4, 80 GB HBM2e
    "L40S": GPU("L40S", 864, 362),  # 48 GB GDDR6
}


def device(name: str) -> GPU:
    """A device of the table by name (case-insensitive)."""
    for key, gpu in DEVICES.items():
        if key.lower() == name.lower():
            return gpu
    raise ValueError(f"unknown device {name!r}; choose one of {', '.join(DEVICES)}")


@dataclass(frozen=True)
class ModelShape:
    """Bytes and FLOPs of a model's step shapes."""

    layer_bytes: int  # decoder-layer weights (read once per step, whatever its rows)
    head_bytes: int  # LM head weights
    layer_params: int  # multiply-accumulates per token in decoder-layer linears
    head_params: int
    kv_bytes_per_token: int  # keys and values of one cached token, all layers
    attention_macs_per_key: int  # per query token and cached key: q·k and p·v, all layers and heads

    def rows(self, rows: list[tuple[float, float]]) -> tuple[float, float]:
        """(bytes, FLOPs) of a step whose rows feed ``(tokens, cached context)`` each; the LM head produces
        logits for every fed position."""
        fed = sum(tokens for tokens, _ in rows)
        keys = sum(tokens * (context + tokens) for tokens, context in rows)
        nbytes = (
            self.layer_bytes
            + self.head_bytes
            + sum(context + tokens for tokens, context in rows) * self.kv_bytes_per_token
        )
        flops = 2 * fed * (self.layer_params + self.head_params) + 2 * keys * self.attention_macs_per_key
        return nbytes, flops

    def step(self, sequences: int, tokens: int, context: int) -> tuple[float, float]:
        """(bytes, FLOPs) of a step: every sequence feeds `tokens` after `context` cached ones."""
        return self.rows([(tokens, context)] * sequences)


def model_shape(config: dict, dtype_bytes: int = 2) -> ModelShape:
    """The shape of a decoder-only transformer from its Hugging Face config (gated MLP, grouped-query attention;
    weights and KV cache in `dtype_bytes`)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim  # q, o; k, v
    mlp = 3 * h * config["intermediate_size"]  # gate, up, down
    layer_params = layers * (attention + mlp)
    head_params = config["vocab_size"] * h
    return ModelShape(
        layer_bytes=layer_params * dtype_bytes,
        head_bytes=head_params * dtype_bytes,
        layer_params=layer_params,
        head_params=head_params,
        kv_bytes_per_token=2 * layers * kv_heads * head_dim * dtype_bytes,
        attention_macs_per_key=2 * heads * head_dim * layers,
    )


def load_model_config(path: str | Path | None = None) -> tuple[str, ModelShape]:
    """(name, shape) of a config.json (default: Qwen2.5-1.5B's); the name is the file's ``name``, else its
    folder's."""
    path = Path(path) if path is not None else DEFAULT_MODEL
    try:
        config = json.loads(path.read_text())
        return config.get("name") or path.resolve().parent.name, model_shape(config)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a model config.json: {exc}") from None


@dataclass
class RooflineCost:
    """A replay's clock on `gpu`: sizes drafts and run-ahead rows (``predict``, ``cheapest``, ``fixed_s``,
    ``per_token_s``, ``per_sequence_s``, as the engine's cost model) and prices steps (``seconds``). The
    drafter's host time per row adds to each step, or runs beside the device's work (`overlap_host`: the step
    takes the longer of the two)."""

    gpu: GPU
    shape: ModelShape
    fixed_s: float = FIXED_S
    host_s_per_row: float = 0.0
    overlap_host: bool = False
    context: float = 0.0  # the last step's mean cached context, which the draft choice prices at

    @property
    def choice(self) -> RooflineCost:
        return self

    @property
    def per_token_s(self) -> float:
        """The compute of one more fed token (what a run-ahead row costs beside a step)."""
        return 2 * (self.shape.layer_params + self.shape.head_params) / self._flops_per_s

    @property
    def per_sequence_s(self) -> float:
        """Reading one more row's keys and values at the last step's mean context."""
        return self.context * self.shape.kv_bytes_per_token / self._bytes_per_s

    @property
    def _bytes_per_s(self) -> float:
        return self.gpu.bandwidth_gb_s * 1e9 * MEMORY_EFFICIENCY

    @property
    def _flops_per_s(self) -> float:
        return self.gpu.bf16_tflops * 1e12 * COMPUTE_EFFICIENCY

    def kernel_seconds(self, rows: list[tuple[float, float]]) -> float:
        """The roofline's time of the step's kernels: bandwidth or compute, whichever bounds."""
        nbytes, flops = self.shape.rows(rows)
        return max(nbytes / self._bytes_per_s, flops / self._flops_per_s)

    def _time(self, rows: list[tuple[float, float]]) -> float:
        device_s = self.fixed_s + self.kernel_seconds(rows)
        host_s = self.host_s_per_row * len(rows)
        return max(device_s, host_s) if self.overlap_host else device_s + host_s

    def seconds(self, rows: list[tuple[int, int]]) -> float:
        """Seconds of a step whose rows feed ``(tokens, cached context)`` each."""
        if rows:
            self.context = sum(context for _, context in rows) / len(rows)
        return self._time(rows)

    def predict(self, tokens: int, sequences: int | None = None) -> float:
        """Seconds of a step of `sequences` (default 1) feeding `tokens` in all, at the last step's mean context."""
        sequences = sequences or 1
        return self._time([(tokens / sequences, self.context)] * sequences)

    def cheapest(self, low: int, high: int, sequences: int) -> float:
        return self.predict(low, sequences)
