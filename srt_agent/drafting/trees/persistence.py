"""The file format of a `RolloutCache`: its config and every prompt's sequences in one .npz.

The token ids of all sequences lie back to back in one int32 array; a JSON entry holds the format version,
the config, and per prompt its key, its sequences' lengths and which of them are run-ahead content. Reading
checks all of it against the array, so a damaged or foreign file raises ValueError and nothing is
half-loaded. One prompt exported alone has the same format.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import numpy as np

from ...files.atomic import write_atomic

FORMAT_VERSION = 1
CONFIG_KEYS = ("max_depth", "max_match", "max_bytes", "max_nodes_per_prompt")


class Persisted(Protocol):
    """What the format reads from and adds to a `RolloutCache` (described here, not imported: its module
    imports this one)."""

    max_depth: int
    max_match: int
    max_bytes: int
    max_nodes_per_prompt: int

    def prompt_keys(self) -> list[Hashable]: ...
    def __contains__(self, prompt_key: Hashable) -> bool: ...
    def sequences(self, prompt_key: Hashable, run_ahead: bool = True) -> list[list[int]]: ...
    def run_ahead_indices(self, prompt_key: Hashable) -> list[int]: ...
    def add_sequence(self, prompt_key: Hashable, token_ids: Sequence[int], run_ahead: bool = False) -> None: ...


Cache = TypeVar("Cache", bound=Persisted)
SavedPrompt = tuple[Hashable, list[int], set[int]]  # key, sequence lengths, indices of run-ahead sequences


def save(cache: Persisted, path: str | os.PathLike) -> None:
    """Write every prompt's sequences to `path` atomically (temp file + rename)."""
    keys = cache.prompt_keys()
    write_atomic(path, lambda f: _write(cache, f, keys))


def load(cls: Callable[..., Cache], path: str | os.PathLike, backend: str, overrides: dict[str, int]) -> Cache:
    """A `cls` rebuilt from a file written by `save`, with its saved config unless overridden."""
    return _rebuilt(cls, *_read(Path(path), str(path)), backend, overrides)


def to_bytes(cache: Persisted) -> bytes:
    """Every prompt's sequences and the cache's config, as `save` writes them."""
    return _bytes_of(cache, cache.prompt_keys())


def from_bytes(cls: Callable[..., Cache], data: bytes, backend: str) -> Cache:
    """A `cls` rebuilt from `to_bytes`'s output."""
    return _rebuilt(cls, *_read(io.BytesIO(data), "cache bytes"), backend, {})


def export_prompt(cache: Persisted, prompt_key: Hashable) -> bytes:
    """One prompt's stored sequences as bytes; running sequences go as far as they got."""
    if prompt_key not in cache:
        raise ValueError(f"unknown prompt key {prompt_key!r}")
    return _bytes_of(cache, [prompt_key])


def import_prompt(cache: Persisted, data: bytes) -> Hashable:
    """Add the sequences of an exported prompt to `cache` (merged into its tree when it has one); its key."""
    _, prompts, flat = _read(io.BytesIO(data), "exported prompt")
    if len(prompts) != 1:
        raise ValueError(f"exported prompt: expected one prompt, got {len(prompts)}")
    _add_prompts(cache, prompts, flat)
    return prompts[0][0]


def _bytes_of(cache: Persisted, keys: list[Hashable]) -> bytes:
    buffer = io.BytesIO()
    _write(cache, buffer, keys)
    return buffer.getvalue()


def _write(cache: Persisted, f: BinaryIO, keys: list[Hashable]) -> None:
    """The sequences of `keys` and the cache's config, as an .npz (token ids as one int32 array)."""
    prompts, chunks = [], []
    for key in keys:
        seqs = cache.sequences(key)
        row = {"key": _encode_key(key), "lengths": [len(s) for s in seqs]}
        run_ahead = cache.run_ahead_indices(key)
        if run_ahead:
            row["run_ahead"] = run_ahead
        prompts.append(row)
        chunks.extend(seqs)
    meta = {
        "version": FORMAT_VERSION,
        "config": {name: getattr(cache, name) for name in CONFIG_KEYS},
        "prompts": prompts,
    }
    flat = np.fromiter((t for s in chunks for t in s), dtype=np.int32)
    np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), tokens=flat)


def _rebuilt(
    cls: Callable[..., Cache], meta: dict, prompts: list[SavedPrompt], flat: list[int], backend: str, overrides: dict
) -> Cache:
    cache = cls(**{**meta["config"], **overrides}, backend=backend)
    _add_prompts(cache, prompts, flat)
    return cache


def _add_prompts(cache: Persisted, prompts: list[SavedPrompt], flat: list[int]) -> None:
    pos = 0
    for key, lengths, run_ahead in prompts:
        for i, n in enumerate(lengths):
            cache.add_sequence(key, flat[pos : pos + n], run_ahead=i in run_ahead)
            pos += n


def _read(source: BinaryIO | Path, name: str) -> tuple[dict, list[SavedPrompt], list[int]]:
    """The metadata, checked prompt entries and flat tokens of a saved cache or exported prompt;
    ValueError naming `name` when it is missing, damaged or not one."""
    try:
        with np.load(source, allow_pickle=False) as data:
            meta = json.loads(data["meta"].tobytes().decode())
            tokens = data["tokens"]
        prompts = _check_saved(meta, tokens)
    except FileNotFoundError as exc:
        raise ValueError(f"{name} is not a saved RolloutCache: no such file") from exc
    except Exception as exc:  # noqa: BLE001 - zip, npy, JSON and layout errors alike
        raise ValueError(f"{name} is not a saved RolloutCache, or is damaged ({type(exc).__name__}: {exc})") from exc
    return meta, prompts, tokens.tolist()


def _check_saved(meta: Any, tokens: np.ndarray) -> list[SavedPrompt]:
    """The prompt entries of a saved cache's metadata, checked against its token array."""
    if not isinstance(meta, dict) or meta.get("version") != FORMAT_VERSION:
        version = meta.get("version") if isinstance(meta, dict) else None
        raise ValueError(f"unsupported cache format version {version!r}")
    config = meta.get("config")
    if not isinstance(config, dict) or set(config) != set(CONFIG_KEYS):
        raise ValueError("the config entry is missing or malformed")
    if not all(type(v) is int for v in config.values()):
        raise ValueError("config values must be integers")
    if tokens.dtype != np.int32 or tokens.ndim != 1:
        raise ValueError(f"tokens must be a flat int32 array, got {tokens.dtype} of shape {tokens.shape}")
    if tokens.size and int(tokens.min()) < 0:
        raise ValueError("negative token ids")
    prompts = []
    for entry in meta.get("prompts") if isinstance(meta.get("prompts"), list) else [None]:
        lengths = entry.get("lengths") if isinstance(entry, dict) else None
        if not isinstance(lengths, list) or not all(type(n) is int and n >= 0 for n in lengths) or "key" not in entry:
            raise ValueError("a prompt entry is malformed")
        run_ahead = entry.get("run_ahead", [])
        if not isinstance(run_ahead, list) or not all(type(i) is int and 0 <= i < len(lengths) for i in run_ahead):
            raise ValueError("a prompt entry's run-ahead indices are malformed")
        prompts.append((_decode_key(entry["key"]), lengths, set(run_ahead)))
    stored = sum(sum(lengths) for _, lengths, _ in prompts)
    if stored != tokens.size:
        raise ValueError(f"the prompts' sequences hold {stored} tokens, the file {tokens.size}")
    return prompts


def _encode_key(key: Hashable) -> Any:
    if isinstance(key, bool) or not isinstance(key, (str, int, tuple)):
        raise ValueError(f"cannot save prompt key {key!r}: keys must be str, int or tuples of them")
    return {"tuple": [_encode_key(k) for k in key]} if isinstance(key, tuple) else key


def _decode_key(value: Any) -> Hashable:
    if isinstance(value, dict) and isinstance(value.get("tuple"), list):
        return tuple(_decode_key(v) for v in value["tuple"])
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"bad prompt key {value!r}")
    return value
