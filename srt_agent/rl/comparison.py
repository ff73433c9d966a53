"""A run's compared variants (``--compare``): each step's regeneration judged against the training rollouts.

Exact variants must give the training rollouts token for token; where they do not, each pair's first
difference is recomputed in float64 and judged (`identity.py`), and the console says why a difference can
happen: a lenient drafter by design, vLLM's own sampler in distribution only, an exact one by near-ties.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..backends import VLLM_IDENTICAL_NOTE
from ..drafting import is_lenient
from .identity import compare_identity, identity_sampling
from .metrics import compare_metrics
from .rollouts import RolloutRun, RolloutVariant


class Comparison:
    """The compared `variants` of a run (`exact`: per variant, whether its backend samples exactly, known
    once the engines started) and every judged difference so far (``differences``, for report.json)."""

    def __init__(self, variants: Sequence[RolloutVariant], sampling):
        self.variants = {v.name: v for v in variants}
        self.sampling = sampling
        self.exact: dict[str, bool] = {}
        self.differences: list[dict] = []

    def judged(self, name: str) -> bool:
        """Whether variant `name` must give the training rollouts token for token."""
        return self.exact.get(name, True) and not is_lenient(self.variants[name].drafter)

    def step_metrics(
        self,
        step: int,
        name: str,
        main: Sequence[RolloutRun],
        runs: Sequence[RolloutRun],
        model: torch.nn.Module,
        dtype: torch.dtype,
    ) -> dict[str, float]:
        """``compare/<name>/…`` of one step; an exact variant's differences judged against `model`'s weights
        (the rollouts' policy, computing in `dtype`) and kept."""
        out = compare_metrics(name, main, runs)
        if out[f"compare/{name}/identical"] < 1 and self.judged(name):
            mine, theirs = ([t for run in rs for t in run.trajectories] for rs in (main, runs))
            metrics, found = compare_identity(name, mine, theirs, model, identity_sampling(self.sampling, dtype), dtype)
            out.update(metrics)
            self.differences += [{"step": step, **d} for d in found]
        return out

    def reasons(self) -> dict[str, str]:
        """Per compared variant, why its rollouts may differ from the training ones."""
        why = {}
        for name, variant in self.variants.items():
            if is_lenient(variant.drafter):
                why[name] = "it accepts drafts leniently: not exactly on-policy"
            elif not self.exact.get(name, True):
                why[name] = VLLM_IDENTICAL_NOTE
            else:
                why[name] = "float32 near-ties can flip between batch shapes"
        return why
