"""`PaidDrafting` keeps drafting only at batch sizes where drafted steps were measured to beat plain ones."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from srt_agent.drafting.choice.guard import PaidDrafting


def run(guard: PaidDrafting, rows: int, steps: int, plain_s: float, drafted_s: float, accepted: int) -> list[bool]:
    """Drive `steps` steps of `rows` rows: a plain step takes `plain_s`, a drafted one (one draft token per row)
    `drafted_s` and emits `accepted` tokens beyond one per row. Returns whether each step drafted."""
    drafted = []
    for _ in range(steps):
        ok = guard.allows(rows)
        drafted.append(ok)
        if ok:
            guard.observe(rows, rows, rows + accepted, drafted_s)
        else:
            guard.observe(rows, 0, rows, plain_s)
    return drafted


def test_plain_steps_come_first_then_paying_drafts_stay_on():
    guard = PaidDrafting()
    drafted = run(guard, rows=2, steps=200, plain_s=0.010, drafted_s=0.012, accepted=2)  # 4 tokens in 12 ms vs 2 in 10
    assert drafted[: guard.min_plain] == [False] * guard.min_plain
    assert guard.suspensions == 0
    assert sum(drafted) / len(drafted) > 0.9  # only the occasional plain probe
    assert guard.gain(2) > 1.5


def test_drafts_that_do_not_pay_are_turned_off_and_tried_less_and_less():
    guard = PaidDrafting()
    drafted = run(
        guard, rows=16, steps=5000, plain_s=0.050, drafted_s=0.080, accepted=2
    )  # 18 tokens in 80 ms vs 16 in 50
    assert guard.suspensions >= 3
    assert sum(drafted) / len(drafted) < 0.01  # the cost of trying again shrinks to nothing
    assert guard.gain(16) < 1


def test_batch_sizes_are_judged_apart():
    guard = PaidDrafting()
    run(guard, rows=16, steps=300, plain_s=0.050, drafted_s=0.080, accepted=2)
    small = run(guard, rows=1, steps=300, plain_s=0.010, drafted_s=0.011, accepted=1)
    assert sum(small) / len(small) > 0.9


@settings(max_examples=60, deadline=None)
@given(
    plain_ms=st.floats(1, 100),
    slowdown=st.floats(1.0, 4.0),
    accepted=st.integers(0, 3),
    rows=st.integers(1, 32),
)
def test_never_much_slower_than_plain_decoding(plain_ms, slowdown, accepted, rows):
    """Whatever a drafted step costs and gains, a long run's tokens per second stay within a few percent of
    plain decoding's or above them."""
    guard = PaidDrafting()
    drafted_s = plain_ms / 1e3 * slowdown
    tokens = seconds = 0.0
    for ok in run(guard, rows, 3000, plain_ms / 1e3, drafted_s, accepted):
        tokens += rows + (accepted if ok else 0)
        seconds += drafted_s if ok else plain_ms / 1e3
    assert tokens / seconds >= 0.97 * rows / (plain_ms / 1e3)
