"""`TokenTree`: the compiled path-compressed tree when the extension is built, else the reference."""

from __future__ import annotations

import warnings

from .tree_ref import ReferenceTokenTree

try:
    from ._tree import TokenTree as CompiledTokenTree
except ImportError as exc:  # the extension is built by `pip install -e .`; keep working without it
    CompiledTokenTree = None
    warnings.warn(
        f"srt_agent.drafting.trees._tree is not built ({exc}); using the slow pure-Python tree. "
        "Rebuild with `pip install -e .` (needs a C++ compiler).",
        RuntimeWarning,
        stacklevel=2,
    )

BACKENDS = ("auto", "compiled", "python")


def tree_class(backend: str = "auto") -> type:
    """The tree implementation for `backend`: 'compiled', 'python' or 'auto' (compiled if built)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown tree backend {backend!r}; choose one of {BACKENDS}")
    if backend == "python" or (backend == "auto" and CompiledTokenTree is None):
        return ReferenceTokenTree
    if CompiledTokenTree is None:
        raise ValueError("the compiled tree is not built: run `pip install -e .` with a C++ compiler")
    return CompiledTokenTree
