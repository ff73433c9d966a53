"""The one Registry shape: lazy ``"module:attr"`` entries imported once, clear errors naming the known ones."""

from __future__ import annotations

import pytest

from srt_agent.backends import REGISTRY
from srt_agent.config.algorithm_registry import ADV_ESTIMATOR_REGISTRY
from srt_agent.config.source_registry import SOURCES
from srt_agent.drafting import DRAFTERS
from srt_agent.registry import Registry, UnknownName, load
from srt_agent.tools import SANDBOX_KINDS

SQRT = "math:sqrt"


def test_a_string_entry_is_imported_when_first_asked_for_and_once():
    registry = Registry("function", {"sqrt": SQRT, "len": len})
    assert registry["sqrt"] is load(SQRT) and registry["sqrt"](9) == 3.0
    assert registry["len"] is len
    assert sorted(registry) == ["len", "sqrt"] and len(registry) == 2 and "sqrt" in registry


def test_an_unknown_name_names_the_known_ones():
    registry = Registry("function", {"sqrt": SQRT, "len": len})
    with pytest.raises(ValueError, match=r"unknown function 'cube'; choose one of \['len', 'sqrt'\]"):
        registry["cube"]
    assert registry.get("cube") is None and "cube" not in registry  # a KeyError for Mapping's methods
    assert isinstance(registry.unknown("cube"), UnknownName)


def test_a_name_holds_one_entry():
    registry = Registry("function", {"sqrt": SQRT})
    registry.add("sqrt", SQRT)  # the same entry again
    with pytest.raises(ValueError, match="function 'sqrt' is already registered"):
        registry.add("sqrt", "math:floor")


def test_every_registry_has_the_one_shape():
    for registry in (DRAFTERS, REGISTRY, SANDBOX_KINDS, SOURCES, ADV_ESTIMATOR_REGISTRY):
        assert isinstance(registry, Registry)
        with pytest.raises(ValueError, match="unknown .* 'nope'; choose one of"):
            registry["nope"]
