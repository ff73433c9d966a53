"""The headroom analysis on hand-made run folders whose answers are known: a repeated trajectory is all
headroom on revisits, a response that copies the start of its prompt is headroom only for a structure
that holds the whole prompt, another prompt's response is headroom on a first visit only for a structure
with a global tree, and the run's own forwards are reported as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srt_agent.bench.headroom import headroom, turns

PROMPT = list(range(100, 160))  # 60 tokens: its start lies beyond SRT's 32-token prompt tail


def write_run(folder: Path, steps: list[list[dict]]) -> Path:
    (folder / "rollouts").mkdir(parents=True)
    for i, rows in enumerate(steps, start=1):
        lines = [json.dumps(row) for row in rows]
        (folder / "rollouts" / f"step-{i:06d}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def row(response: list[int], mask: list[int] | None = None, forwards: int | None = None, prompt=PROMPT) -> dict:
    mask = mask or [1] * len(response)
    return {
        "prompt_ids": prompt,
        "response_ids": response,
        "response_mask": mask,
        "forwards": forwards if forwards is not None else sum(mask),
        "model_tokens": sum(mask),
    }


def test_turns_are_the_runs_of_sampled_tokens():
    assert turns([1, 1, 0, 0, 1, 0, 1, 1, 1]) == [(0, 2), (4, 5), (6, 9)]
    assert turns([]) == [] and turns([0, 0]) == []


def test_a_trajectory_seen_before_is_all_headroom_on_its_revisit(tmp_path):
    response = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 11, 12, 13, 14, 15, 16, 17]  # 17 tokens, no repeats to copy
    run = write_run(tmp_path, [[row(response, forwards=17)], [row(response, forwards=5)]])
    result = headroom(run, k=8)
    first, again = result["steps"]
    assert not first["revisit"] and again["revisit"]
    assert first["achieved_tokens_per_forward"] == 1.0 and again["achieved_tokens_per_forward"] == 17 / 5
    assert first["methods"]["srt"]["oracle"] == 17  # nothing to draft from: a forward per token
    # step 2: SRT's tree holds the response after its prompt; each forward accepts 8 drafted tokens and
    # samples one more (9 + 8 tokens). SuffixDecoding's global tree holds responses without their prompts,
    # so the first token has no anchor (1 + 9 + 7).
    for method, forwards in (("srt", 2), ("srt+prompt", 2), ("srt+global", 2), ("suffix", 3)):
        m = again["methods"][method]
        assert m["oracle"] == m["frequent"] == forwards, (method, m)
    assert result["totals"]["revisits"]["srt"]["oracle"] == pytest.approx(8.5)


def test_copying_the_prompt_is_headroom_only_for_a_structure_holding_the_whole_prompt(tmp_path):
    response = PROMPT[:16]  # the start of the prompt again, outside the 32-token tail SRT's trees keep
    run = write_run(tmp_path, [[row(response)]])
    (step,) = headroom(run, k=8)["steps"]
    assert step["methods"]["srt"]["oracle"] == 16  # nothing of it in SRT's trees
    assert all(step["methods"][m]["oracle"] < 16 for m in ("suffix", "srt+prompt", "srt+global"))
    # the frequent path copies the prompt: 1 forward for the first token (nothing follows the prompt's end),
    # then 8 drafted + 1 sampled, then 5 + 1 (the turn's last token is never drafted)
    assert step["methods"]["srt+global"]["frequent"] == step["methods"]["srt+prompt"]["frequent"] == 3


def test_another_prompts_response_is_headroom_on_a_first_visit_only_with_a_global_tree(tmp_path):
    response = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 11, 12, 13, 14, 15, 16, 17]
    other = list(range(200, 260))
    run = write_run(tmp_path, [[row(response)], [row(response, prompt=other)]])
    first, second = headroom(run, k=8)["steps"]
    assert not second["revisit"]
    # as SuffixDecoding's global tree on the revisit above: 1 + 9 + 7 tokens; SRT's trees hold no history of
    # the second prompt, nor does its whole prompt hold the response
    for method, forwards in (("srt", 17), ("srt+prompt", 17), ("srt+global", 3), ("suffix", 3)):
        m = second["methods"][method]
        assert m["oracle"] == m["frequent"] == forwards, (method, m)


def test_forced_tokens_are_context_not_generated(tmp_path):
    response = [5, 6, 7, 900, 901, 902, 5, 6, 7]
    run = write_run(tmp_path, [[row(response, mask=[1, 1, 1, 0, 0, 0, 1, 1, 1])]])
    (step,) = headroom(run, k=8)["steps"]
    m = step["methods"]["srt"]
    assert m["generated"] == 6
    # first turn: nothing to draft (3 forwards); second turn: nothing ever followed "902" (1 forward for
    # "5"), then the first turn's "5 6 7" says what follows "5" (one forward accepts "6" and samples "7")
    assert m["oracle"] == 3 + 2


def test_a_folder_without_rollouts_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no rollouts/step"):
        headroom(tmp_path)
    with pytest.raises(ValueError, match="unknown method"):
        headroom(write_run(tmp_path / "r", [[row([1, 2])]]), methods=["medusa"])


def test_chain_choices_are_measured_beside_the_frequent_path(tmp_path):
    """`--choice` adds each named way to choose the chain; on a repeated trajectory every choice drafts it; the
    expected-length chain prefers a long certain continuation to the locally most frequent child."""
    response = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 11, 12, 13, 14, 15, 16, 17]
    run = write_run(tmp_path, [[row(response)], [row(response)]])
    result = headroom(run, k=8, methods=["srt"], choices=["expected", "context-4", "backoff-2", "frequent"])
    assert result["choices"] == ["expected", "context-4", "backoff-2"]
    again = result["steps"][1]["methods"]["srt"]
    assert again["expected"] == again["frequent"] == again["context-4"] == again["backoff-2"] == again["oracle"]
    assert set(result["totals"]["revisits"]["srt"]) == {"oracle", "frequent", "expected", "context-4", "backoff-2"}
    with pytest.raises(ValueError, match="unknown chain choice"):
        headroom(run, k=8, choices=["longest"])


def test_the_expected_chain_takes_the_long_sure_branch_over_the_frequent_child():
    from srt_agent.bench.chain_choice import chain_choice
    from srt_agent.drafting import RolloutCache

    cache = RolloutCache(max_depth=16, max_match=2)
    for tail in ([10, 11], [10, 12], [10, 13]):  # "10" is the most frequent next token, then the paths split
        cache.add_sequence("p", [1, 2, *tail])
    cache.add_sequence("p", [1, 2, 20, 21, 22, 23, 24, 25])  # "20" once, then a long sure continuation
    assert chain_choice("frequent")(cache, "p", [1, 2], 6).token_ids == [10, 11]
    assert chain_choice("expected")(cache, "p", [1, 2], 6).token_ids == [20, 21, 22, 23, 24, 25]


def test_a_token_tree_collects_what_a_chain_leaves_at_a_branch(tmp_path):
    """After a branch the run has seen both ways, a chain bets on one; a tree of drafts holds both."""
    first, second = [5, 6, 7, 8, 9, 10], [5, 6, 20, 21, 22, 23]
    run = write_run(tmp_path, [[row(first), row(second)], [row(second)]])
    result = headroom(run, k=8, methods=["srt"], choices=["tree-16"])
    again = result["steps"][1]["methods"]["srt"]
    assert again["tree-16"] < again["frequent"]  # the chain follows 7 (the lower token of a tie), the run took 20


def test_a_recent_window_forgets_what_older_steps_sampled(tmp_path):
    """Step 1 samples `old`, step 2 another prompt's response, step 3 `old` again: all SRT's trees hold it
    there, and so do the last two steps' (srt-last2); the last step's alone (srt-last1) do not."""
    old = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 11, 12, 13, 14, 15, 16, 17]
    other = [p + 100 for p in PROMPT]
    run = write_run(tmp_path, [[row(old)], [row(old[::-1], prompt=other)], [row(old)]])
    result = headroom(run, k=8, methods=("srt", "srt-last1", "srt-last2"))
    third = result["steps"][2]["methods"]
    assert third["srt"]["oracle"] == third["srt-last2"]["oracle"] == 2
    assert third["srt-last1"]["oracle"] == third["srt-last1"]["frequent"] == len(old)  # step 1 is forgotten
    with pytest.raises(ValueError, match="-lastN"):
        headroom(run, methods=("srt-last0",))
