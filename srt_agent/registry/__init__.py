"""One registry shape for every name a config or a caller can use (drafters, backends, sandboxes, environment
sources, advantage estimators and policy losses): a :class:`Registry` maps names to entries, and
:func:`load` imports a ``"module:attr"`` target once, on first use, so a registry costs nothing until an
entry is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

E = TypeVar("E")
_LOADED: dict[tuple[str, str | None], Any] = {}


class UnknownName(ValueError, KeyError):
    """A name no entry has; the message names the known ones (a ValueError for callers, a KeyError for
    ``Mapping`` methods)."""

    __str__ = ValueError.__str__


def load(target: Any, package: str | None = None) -> Any:
    """`target` itself, or, for a ``"module:attr"`` string (a relative module against `package`), that
    attribute, imported once."""
    if not isinstance(target, str):
        return target
    key = (target, package)
    if key not in _LOADED:
        module, _, attr = target.partition(":")
        _LOADED[key] = getattr(importlib.import_module(module, package), attr)
    return _LOADED[key]


class Registry(MutableMapping[str, E], Generic[E]):
    """Name → entry for one `kind` of thing; an unknown name is an :class:`UnknownName` naming the known ones.
    An entry given as ``"module:attr"`` (relative modules against `package`) is imported when first asked for.
    Entries are added with :meth:`add` (a clash with a different entry under the same name is a ValueError);
    item assignment replaces one (what a test's monkeypatch does)."""

    def __init__(self, kind: str, entries: Mapping[str, E | str] | None = None, package: str | None = None):
        self.kind, self.package = kind, package
        self._entries: dict[str, E | str] = {}
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: E) -> E:
        old = self._entries.get(name)
        if old is not None and old != entry:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unknown(self, name: object) -> UnknownName:
        return UnknownName(f"unknown {self.kind} {name!r}; choose one of {sorted(self._entries)}")

    def __getitem__(self, name: str) -> E:
        try:
            entry = self._entries[name]
        except KeyError:
            raise self.unknown(name) from None
        return load(entry, self.package)

    def __setitem__(self, name: str, entry: E) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
