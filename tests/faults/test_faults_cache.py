"""Faults at the rollout cache's file: damaged on load, and a save interrupted by an error or a kill.

A truncated or corrupted file either loads to exactly what was saved or raises ValueError naming the
file (never another exception, never a silently different cache); an interrupted save leaves the
previous file loadable and unchanged, and leaves no temp file behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers.fault_injection import InjectedFault
from helpers.faults_report import FaultRecord
from hypothesis import HealthCheck, given, settings, strategies as st

from srt_agent.drafting import RolloutCache


def filled_cache(seed: int = 0, prompts: int = 4, rollouts: int = 3, length: int = 80) -> RolloutCache:
    rng = random.Random(seed)
    cache = RolloutCache(max_depth=16, max_match=8)
    for p in range(prompts):
        for _ in range(rollouts):
            cache.add_sequence(("task", p), [rng.randrange(500) for _ in range(length)])
    return cache


def contents(cache: RolloutCache) -> dict:
    return {key: cache.sequences(key) for key in cache.prompt_keys()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("cache") / "rollout_cache.npz"
    cache = filled_cache()
    cache.save(path)
    return path.read_bytes(), contents(cache)


damage = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 0.999), st.just(0)),
    st.tuples(st.just("flip"), st.floats(0.0, 0.999), st.integers(1, 255)),
    st.tuples(st.just("zero tail"), st.floats(0.0, 0.999), st.just(0)),
)


def apply_damage(saved: bytes, hits) -> tuple[bytes, list[str]]:
    """`saved` with `hits` applied in order, and the kinds of the hits that changed it.

    No hit can leave the file as saved: a flip sets its byte to one that differs from the saved byte
    (a second flip of it cannot undo the first), a zeroed tail starts at or before the saved file's last
    non-zero byte, a truncation cuts at least one byte and the file never grows back.
    """
    data, fired = bytearray(saved), []
    last_nonzero = max(i for i, b in enumerate(saved) if b)
    for how, where, value in hits:
        before = bytes(data)
        if how == "truncate":
            del data[int(where * len(data)) :]
        elif how == "flip" and data:
            at = int(where * len(data))
            data[at] = saved[at] ^ value
        elif how == "zero tail":
            at = int(where * (last_nonzero + 1))
            data[at:] = bytes(max(0, len(data) - at))
        if bytes(data) != before:
            fired.append(how)
    return bytes(data), fired


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hits=st.lists(damage, min_size=1, max_size=3))
def test_a_damaged_file_loads_exactly_or_raises_a_clear_error(tmp_path, saved, ledger, hits):
    data, fired = apply_damage(saved[0], hits)
    assert fired and data != saved[0]  # every example really damages the file
    path = tmp_path / "damaged.npz"
    path.write_bytes(data)
    try:
        loaded = contents(RolloutCache.load(path))
    except ValueError as exc:
        assert str(path) in str(exc)
        wrong = 0
    else:
        wrong = int(loaded != saved[1])  # a damaged file that loads must load exactly what was saved
    ledger.record(FaultRecord("cache file", "+".join(sorted(set(fired))), 1, 0, wrong, 0))
    assert wrong == 0


def check_intact(path, want, ledger, kind: str) -> None:
    leftovers = sorted(p.name for p in path.parent.iterdir() if p != path)
    intact = contents(RolloutCache.load(path)) == want
    ledger.record(FaultRecord("cache save", kind, 1, 1, int(not intact), len(leftovers)))
    assert intact and leftovers == []


@pytest.mark.parametrize("where", ["while writing", "at fsync", "at the rename"])
def test_an_interrupted_save_keeps_the_previous_file(tmp_path, ledger, monkeypatch, where):
    path = tmp_path / "rollout_cache.npz"
    old = filled_cache(seed=1)
    old.save(path)
    real_savez = np.savez

    def broken_savez(f, **arrays):
        real_savez(f, **arrays)
        f.truncate(f.tell() // 2)
        raise InjectedFault("the disk filled up")

    def broken(*args, **kwargs):
        raise InjectedFault(f"failed {where}")

    target = {
        "while writing": (np, "savez", broken_savez),
        "at fsync": (os, "fsync", broken),
        "at the rename": (os, "replace", broken),
    }
    monkeypatch.setattr(*target[where])
    with pytest.raises(InjectedFault):
        filled_cache(seed=2).save(path)
    monkeypatch.undo()
    check_intact(path, contents(old), ledger, f"error {where}")


WRITER = textwrap.dedent(
    """
    import random, sys
    from srt_agent.drafting import RolloutCache
    cache = RolloutCache(max_depth=16, max_match=8)
    rng = random.Random(3)
    for p in range(64):
        for _ in range(8):
            cache.add_sequence(p, [rng.randrange(30000) for _ in range(2000)])
    print("ready", flush=True)
    while True:
        cache.save(sys.argv[1])
    """
)


def test_a_writer_killed_mid_save_leaves_the_previous_file_and_no_temp_file(tmp_path, ledger):
    """A process saving over and over is SIGKILLed at a random moment; the next save cleans up after it."""
    path = tmp_path / "rollout_cache.npz"
    old = filled_cache(seed=4)
    old.save(path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 30
        while not any(p.suffix == ".tmp" for p in tmp_path.iterdir()):  # kill it mid-save
            assert time.monotonic() < deadline, "the writer never started a save"
            time.sleep(0.005)
        time.sleep(random.Random(0).uniform(0, 0.05))
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    saved_by_writer = contents(RolloutCache.load(path))  # complete: the old cache or one of the writer's saves
    assert saved_by_writer == contents(old) or len(saved_by_writer) == 64
    old.save(path)  # the next save removes the dead writer's temp file
    check_intact(path, contents(old), ledger, "writer SIGKILLed")
