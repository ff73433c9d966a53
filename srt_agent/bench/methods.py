"""The rollout methods the benchmarks compare, in one table, and the env config a benchmark's RL run uses.

A method is a drafter on a backend, with or without run-ahead, sampling exactly or (vLLM only) with
vLLM's own sampler. `bench paper` and `bench ablation` run the methods on the env's backend; `bench vllm`
the ones that name their backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..config import EnvConfig, load_env_config
from ..drafting import is_lenient
from ..engine.options import RunAheadOptions
from ..rl.rollouts import RolloutVariant


@dataclass(frozen=True)
class Method:
    """A rollout method: a drafter on `backend` (None: the env config's), with or without run-ahead;
    `exact_sampling` False: vLLM's own sampler instead of the one that samples plain decoding's tokens."""

    name: str
    label: str
    drafter: str
    run_ahead: bool = False
    backend: str | None = None
    exact_sampling: bool = True

    @property
    def exact(self) -> bool:
        """Whether its rollouts are token for token plain decoding's: exact sampling, exact acceptance."""
        return self.exact_sampling and not is_lenient(self.drafter)

    def variant(
        self, run_ahead: RunAheadOptions | None, own_engine: bool = False, name: str | None = None
    ) -> RolloutVariant:
        """The trainer's rollout variant of this method (`run_ahead`: the options it runs ahead with, if it does)."""
        return RolloutVariant(
            name or self.name,
            self.drafter,
            run_ahead if self.run_ahead else None,
            backend=self.backend,
            exact_sampling=None if self.exact_sampling else False,
            own_engine=own_engine,
        )


# vLLM methods are built in this order. vLLM's ngram proposer imports numba, whose llvmlite holds an object
# that vLLM 0.31's kernel re-binding scan (run whenever an engine starts) cannot read: no vLLM engine can
# start in this process after it, so it comes last of them.
ALL_METHODS = (
    Method("none", "Baseline (no speculation)", "none"),
    Method("ngram", "N-gram prompt lookup", "ngram"),
    Method("suffix", "SuffixDecoding (ours)", "suffix"),
    Method("arctic", "SuffixDecoding (arctic-inference)", "arctic"),
    Method("history", "History trees (RhymeRL-style)", "history"),
    Method("self", "EfficientRollout (quantized self-draft)", "self"),
    Method("spec-rl", "SPEC-RL (lenient: not exactly on-policy)", "spec-rl"),
    Method("srt", "SRT, no run-ahead", "srt"),
    Method("srt+run-ahead", "SRT + run-ahead", "srt", run_ahead=True),
    Method("srt+self", "SRT + self-drafter", "srt+self"),
    Method("vllm:none", "vLLM, no speculation", "none", backend="vllm"),
    Method("vllm:stock", "vLLM as shipped (its own sampler)", "none", backend="vllm", exact_sampling=False),
    Method("vllm:suffix", "vLLM's SuffixDecoding proposer", "suffix", backend="vllm"),
    Method("vllm:srt", "SRT inside vLLM", "srt", backend="vllm"),
    Method("vllm:srt+ahead", "SRT + run-ahead inside vLLM", "srt", run_ahead=True, backend="vllm"),
    Method("vllm:ngram", "vLLM's n-gram proposer", "ngram", backend="vllm"),
    Method("engine:none", "Our engine, no speculation", "none", backend="engine"),
    Method("engine:srt", "SRT in our engine", "srt", backend="engine"),
)


def pick(names: Sequence[str], methods: Sequence[Method], baseline: str, as_named: bool = False) -> list[Method]:
    """The named `methods`, `baseline` first (it always runs), the others in the table's order (in the
    order of `names` when `as_named`)."""
    known = {m.name: m for m in methods}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(known)}")
    order = names if as_named else [m.name for m in methods if m.name in names]
    return [known[baseline]] + [known[n] for n in order if n != baseline]


def bench_env(env: str, steps: int, shape: Sequence[str] = (), overrides: Sequence[str] = ()) -> EnvConfig:
    """The env file as a benchmark's RL run of `steps` steps uses it: no drafters compared but the
    benchmark's own variants, a checkpoint at the end only, no loggers; then the benchmark's `shape` and
    the user's `overrides` (KEY=VALUE each)."""
    fixed = [f"train.steps={steps}", "train.compare=[]", f"train.checkpoint_every={steps}", "train.loggers=[]"]
    return load_env_config(env, fixed + list(shape) + list(overrides))
