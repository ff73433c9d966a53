"""The one drafter registry: every drafter by name, how it is built, and how (whether) it runs inside vLLM.

A new drafter is one entry here: its class (imported on first use, so a drafter that runs a model or needs an
optional package costs nothing until chosen) and, where vLLM can run it, vLLM's ``speculative_config`` method.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..registry import Registry, load
from .drafter import Drafter, DrafterCapabilities


@dataclass(frozen=True)
class DrafterEntry:
    """A drafter: its class as ``module:Class`` and, where vLLM runs it, vLLM's speculative method
    (``custom_class`` runs SRT's proposer inside vLLM; ``ngram`` and ``suffix`` are vLLM's own)."""

    target: str
    vllm_method: str | None = None

    def load(self) -> type:
        return load(self.target, __package__)


DRAFTERS: Registry[DrafterEntry] = Registry(
    "drafter",
    {
        "none": DrafterEntry(".drafters.none:NoDrafter", vllm_method="none"),
        "srt": DrafterEntry(".drafters.srt:SRTDrafter", vllm_method="custom_class"),
        "ngram": DrafterEntry(".drafters.ngram:NgramDrafter", vllm_method="ngram"),
        "suffix": DrafterEntry(".drafters.suffix:SuffixDrafter", vllm_method="suffix"),
        "history": DrafterEntry(".drafters.history:HistoryDrafter"),
        "arctic": DrafterEntry(".drafters.arctic:ArcticDrafter"),
        "self": DrafterEntry(".drafters.self_drafter:SelfDrafter"),
        "srt+self": DrafterEntry(".drafters.hybrid_drafter:HybridDrafter"),
        # reuses the previous epoch's rollouts with lenient acceptance: not exactly on-policy
        "spec-rl": DrafterEntry(".drafters.spec_rl:SpecRLDrafter"),
    },
)


def drafter_capabilities(name: str) -> DrafterCapabilities:
    """What the drafter `name` declares (its class is imported)."""
    return _entry(name).load().capabilities


def exact_drafters(*, model: bool = True, baseline: bool = True) -> tuple[str, ...]:
    """The registered drafters whose rollouts are plain decoding's (every one but the lenient), in the registry's
    order (read at each call: a drafter registered later counts); `model` False leaves out those that run a
    model, `baseline` False the one that never drafts. What the benchmarks run by default."""
    names = []
    for name in DRAFTERS:
        caps = drafter_capabilities(name)
        if not caps.lenient and (model or not caps.model) and (baseline or caps.drafts):
            names.append(name)
    return tuple(names)


def runs_as_proposer(name: str) -> bool:
    """Whether vLLM runs drafter `name` through srt-agent's own proposer (``custom_class``), where what the drafter
    declares (trees, run-ahead) is what SRT's proposer offers inside vLLM; vLLM's own drafters offer none of it."""
    entry = DRAFTERS.get(name)
    return entry is not None and entry.vllm_method == "custom_class"


def is_lenient(name: str) -> bool:
    """Whether `name`'s drafts are accepted leniently (not token for token): its rollouts are not exactly
    on-policy."""
    return name in DRAFTERS and drafter_capabilities(name).lenient


def make_drafter(name: str, **options) -> Drafter:
    """A new drafter by name (none, srt, ngram, suffix, history, arctic, self, srt+self, spec-rl) with its
    keyword options."""
    cls = _entry(name).load()
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"bad options for drafter {name!r}: {exc}") from None


def drafter_unavailable(name: str) -> str | None:
    """Why the drafter `name` cannot run here (an unknown name, a package that is not installed), or None
    when it can."""
    try:
        make_drafter(name)
    except ValueError as exc:
        return str(exc)
    return None


def vllm_drafters() -> tuple[str, ...]:
    """The drafters vLLM runs, in the registry's order (read at each call: a drafter registered later counts)."""
    return tuple(name for name, entry in DRAFTERS.items() if entry.vllm_method is not None)


def vllm_problem(name: str) -> str | None:
    """Why vLLM cannot run the drafter `name` (it has no counterpart of it), or None when it can."""
    if name in vllm_drafters():
        return None
    return f"drafter {name!r} has no vLLM counterpart; the vLLM backend runs {', '.join(vllm_drafters())}"


def _entry(name: str) -> DrafterEntry:
    return DRAFTERS[name]  # an unknown name: a ValueError naming the known ones
