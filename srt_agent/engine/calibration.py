"""The cost model's seed: measured forward + LM-head times of the shapes a step runs."""

from __future__ import annotations

import time

from ..runner.model_runner import Chunk, ModelRunner

CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 32)


def measure_step_costs(
    runner: ModelRunner, slots: list[int], sizes: tuple[int, ...] = CALIBRATION_SIZES
) -> list[tuple[int, float, int]]:
    """(tokens, best seconds of two, sequences) of one sequence feeding each of `sizes` tokens, and of every
    free slot in `slots` feeding one and two tokens (a full batch verifying a little)."""
    shapes = [(1, min(n, runner.capacity)) for n in sizes]
    if len(slots) > 1:
        shapes += [(len(slots), 1), (len(slots), 2)]
    runner.forward([Chunk(slots[0], 0, [0], 1)])  # warm-up
    samples = []
    for sequences, n in shapes:
        chunks = [Chunk(slot, 0, [0] * n, n) for slot in slots[:sequences]]
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            runner.logits(runner.forward(chunks))
            runner.synchronize()
            best = min(best, time.perf_counter() - t0)
        samples.append((sequences * n, best, sequences))
    return samples
