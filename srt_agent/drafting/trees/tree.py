"""`TokenTree`: the compiled path-compressed tree when the extension is built, else the reference; and
`extend_rows`, a batch's appends to many trees in one call (compiled for compiled trees)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from ..tokens import check_tokens
from .tree_ref import ReferenceTokenTree

try:
    from . import _tree
    from ._tree import TokenTree as CompiledTokenTree
except ImportError as exc:  # the extension is built by `pip install -e .`; keep working without it
    CompiledTokenTree = _tree = None
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


def reference_extend_rows(
    trees: Sequence,
    seqs: Sequence[int],
    tokens: Sequence[int],
    offsets: Sequence[int],
    start: int,
    max_nodes: int,
    nbytes: int,
    max_bytes: int,
) -> tuple[int, int]:
    """Rows `start` on of a batch: row r appends ``tokens[offsets[r]:offsets[r + 1]]`` to sequence ``seqs[r]``
    of ``trees[r]`` (None: nothing). All is checked before anything changes. Stops after the first row whose tree
    passes `max_nodes` nodes, or after which `nbytes` (the caller's running total, moved by each tree's change)
    passes `max_bytes`: returns (that row, or the row count, and the total). The compiled one does the same."""
    tokens = check_tokens(tokens)
    for r in range(start, len(trees)):
        if trees[r] is not None and not trees[r].is_open(seqs[r]):
            raise ValueError(f"sequence {seqs[r]} is not open in this tree")
    for r in range(start, len(trees)):
        tree = trees[r]
        if tree is None:
            continue
        before = tree.nbytes
        tree.extend(seqs[r], tokens[offsets[r] : offsets[r + 1]])
        nbytes += tree.nbytes - before
        if tree.num_nodes > max_nodes or nbytes > max_bytes:
            return r, nbytes
    return len(trees), nbytes


def extend_rows_for(tree_cls: type) -> Callable[..., tuple[int, int]]:
    """The `extend_rows` for trees of `tree_cls`."""
    compiled = getattr(_tree, "extend_rows", None)  # an extension built before it has none: each row then calls in
    return compiled if tree_cls is CompiledTokenTree and compiled is not None else reference_extend_rows
