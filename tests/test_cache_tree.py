"""Token trees against a brute-force reference that scans every stored sequence.

Both implementations (the readable reference trie and the compiled path-compressed tree) must
give the brute-force counts, matches and drafts for any streaming interleaving of sequences.
"""

from __future__ import annotations

import heapq
import random
import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from srt_agent.drafting import ReferenceTokenTree
from srt_agent.drafting.trees.tree import CompiledTokenTree

BACKENDS = [
    pytest.param(ReferenceTokenTree, id="python"),
    pytest.param(
        CompiledTokenTree,
        id="compiled",
        marks=pytest.mark.skipif(CompiledTokenTree is None, reason="extension not built"),
    ),
]
needs_compiled = pytest.mark.skipif(CompiledTokenTree is None, reason="extension not built")


# ---- brute force ----------------------------------------------------------------------------
def bf_count(seqs: list[list[int]], path: list[int], depth: int) -> int:
    if not 1 <= len(path) <= depth:
        return 0
    n = len(path)
    return sum(1 for s in seqs for i in range(len(s) - n + 1) if s[i : i + n] == path)


def bf_next(seqs: list[list[int]], path: list[int], depth: int) -> Counter:
    """Next-token counts after the occurrences of `path` (only while the window fits in depth)."""
    n = len(path)
    if n + 1 > depth:
        return Counter()
    return Counter(s[i + n] for s in seqs for i in range(len(s) - n) if s[i : i + n] == path)


def bf_match(seqs, context, max_match, depth) -> int:
    for length in range(min(len(context), max_match, depth - 1), 0, -1):
        if bf_next(seqs, list(context[len(context) - length :]), depth):
            return length
    return 0


def bf_draft(seqs, context, budget, max_match, depth, chain=False, min_prob=0.0):
    """Best-first by path probability; ties by push order, children by (count desc, token asc)."""
    m = bf_match(seqs, context, max_match, depth)
    if m == 0 or budget == 0:
        return [], [], [], 0
    tokens, parents, scores, heap, pushed = [], [], [], [], 0

    def push(path, index, score, room):
        nonlocal pushed
        kids = sorted(bf_next(seqs, path, depth).items(), key=lambda kv: (-kv[1], kv[0]))
        continued = sum(c for _, c in kids)  # occurrences followed by a token (those ending here do not vote)
        for tok, c in kids[: 1 if chain else room]:
            s = score * (c / continued)
            if s < min_prob:
                break
            heapq.heappush(heap, (-s, pushed, index, path + [tok]))
            pushed += 1

    push(list(context[len(context) - m :]), -1, 1.0, budget)
    while heap and len(tokens) < budget:
        neg, _, parent, path = heapq.heappop(heap)
        tokens.append(path[-1])
        parents.append(parent)
        scores.append(-neg)
        push(path, len(tokens) - 1, -neg, budget - len(tokens))
    return tokens, parents, scores, (m if tokens else 0)


# ---- strategies -----------------------------------------------------------------------------
@st.composite
def streamed(draw):
    """Sequences over a small alphabet (lots of repetition) and an interleaved insertion schedule."""
    depth = draw(st.integers(2, 9))
    alphabet = draw(st.integers(1, 4))
    seqs = draw(st.lists(st.lists(st.integers(0, alphabet - 1), max_size=40), min_size=1, max_size=5))
    if draw(st.booleans()) and seqs[0]:  # a later sequence copying a span of the first
        a = draw(st.integers(0, len(seqs[0]) - 1))
        seqs.append(seqs[0][a:] + draw(st.lists(st.integers(0, alphabet), max_size=6)))
    schedule = draw(st.lists(st.tuples(st.integers(0, len(seqs) - 1), st.integers(1, 7)), max_size=60))
    return depth, seqs, schedule


def build(tree_cls, depth, seqs, schedule, close_all=True):
    """Stream `seqs` into a new tree in the order `schedule` gives, then finish the rest."""
    tree = tree_cls(depth)
    ids = [tree.add_sequence() for _ in seqs]
    done = [0] * len(seqs)
    for i, n in schedule:
        tree.extend(ids[i], seqs[i][done[i] : done[i] + n])
        done[i] = min(len(seqs[i]), done[i] + n)
    for i, s in enumerate(seqs):
        tree.extend(ids[i], s[done[i] :])
        if close_all:
            tree.close(ids[i])
    return tree, ids


def all_paths(seqs, depth):
    paths = {tuple(s[i : i + n]) for s in seqs for n in range(1, depth + 1) for i in range(len(s) - n + 1)}
    return sorted(paths) + [(99,), (0, 99)]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- properties -----------------------------------------------------------------------------
@pytest.mark.parametrize("tree_cls", BACKENDS)
@SETTINGS
@given(streamed())
def test_counts_match_brute_force(tree_cls, case):
    depth, seqs, schedule = case
    tree, _ = build(tree_cls, depth, seqs, schedule)
    for path in all_paths(seqs, depth):
        assert tree.count(list(path)) == bf_count(seqs, list(path), depth), path
    assert tree.num_tokens == sum(map(len, seqs))
    assert tree.count([]) == 0
    if hasattr(tree, "validate"):
        tree.validate()


@pytest.mark.parametrize("tree_cls", BACKENDS)
@SETTINGS
@given(streamed(), st.data())
def test_match_and_draft_match_brute_force(tree_cls, case, data):
    depth, seqs, schedule = case
    tree, ids = build(tree_cls, depth, seqs, schedule, close_all=False)
    for _ in range(4):
        src = data.draw(st.sampled_from(seqs))
        cut = data.draw(st.integers(0, len(src)))
        context = src[:cut] + data.draw(st.lists(st.integers(0, 4), max_size=2))
        max_match = data.draw(st.integers(1, depth))
        budget = data.draw(st.integers(0, 12))
        chain = data.draw(st.booleans())
        min_prob = data.draw(st.sampled_from([0.0, 0.2, 0.5]))
        assert tree.match(context, max_match) == bf_match(seqs, context, max_match, depth)
        expected = bf_draft(seqs, context, budget, max_match, depth, chain, min_prob)
        assert tuple(tree.draft(context, budget, max_match, chain, min_prob)) == expected
        # The open-sequence shortcut gives the same draft whenever the context ends like it.
        i = data.draw(st.integers(0, len(seqs) - 1))
        own = seqs[i][len(seqs[i]) - data.draw(st.integers(0, len(seqs[i]))) :]
        assert tuple(tree.draft(own, budget, max_match, chain, min_prob, ids[i])) == bf_draft(
            seqs, own, budget, max_match, depth, chain, min_prob
        )


@needs_compiled
@SETTINGS
@given(streamed())
def test_compiled_memory_is_linear_in_tokens(case):
    """Path compression: branching nodes, leaves and ends of sequences only, never depth x tokens."""
    depth, seqs, schedule = case
    tree, _ = build(CompiledTokenTree, depth, seqs, schedule)
    tokens = sum(map(len, seqs))
    assert tree.num_nodes <= 1 + 2 * tokens + depth * len(seqs)


@needs_compiled
def test_compiled_equals_reference_on_a_long_rl_like_stream():
    """Hundreds of interleaved rollouts copying spans of each other: same counts and drafts."""
    rng = random.Random(7)
    depth = 24
    ref, fast = ReferenceTokenTree(depth), CompiledTokenTree(depth)
    done: list[list[int]] = []
    for _ in range(4):  # waves of 6 rollouts streamed token by token in lockstep
        live = [(ref.add_sequence(), fast.add_sequence(), []) for _ in range(6)]
        assert all(a == b for a, b, _ in live)
        plans = []
        for _ in live:
            plan: list[int] = []
            while len(plan) < 300:
                if done and rng.random() < 0.6:
                    src = rng.choice(done)
                    at = rng.randrange(len(src))
                    plan += [t if rng.random() > 0.05 else rng.randrange(50) for t in src[at : at + 40]]
                else:
                    plan += [rng.randrange(50) for _ in range(rng.randint(1, 20))]
            plans.append(plan[:300])
        for pos in range(300):
            for (a, b, toks), plan in zip(live, plans):
                ref.extend(a, [plan[pos]])
                fast.extend(b, [plan[pos]])
                toks.append(plan[pos])
                if pos % 37 == 0:
                    assert tuple(fast.draft(toks, 16, 12, False, 0.0, b)) == tuple(ref.draft(toks, 16, 12))
        for a, b, toks in live:
            ref.close(a)
            fast.close(b)
            done.append(toks)
    fast.validate()
    for s in done[:6]:
        for i in range(0, len(s) - depth, 11):
            for n in (1, 5, depth):
                assert fast.count(s[i : i + n]) == ref.count(s[i : i + n])
    assert fast.num_nodes < ref.num_nodes / 4
    assert fast.nbytes < 100 * fast.num_tokens


# ---- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("tree_cls", BACKENDS)
@pytest.mark.parametrize("bad", [[-1], [1, -5], [2**31], [1.5], ["a"], [None]])
def test_bad_tokens_raise_and_leave_the_tree_untouched(tree_cls, bad):
    tree = tree_cls(8)
    seq = tree.add_sequence()
    tree.extend(seq, [1, 2, 3, 1, 2])
    before = (tree.num_nodes, tree.num_tokens, tree.count([1, 2]), tree.sequence(seq))
    with pytest.raises((ValueError, TypeError)):
        tree.extend(seq, [4] + bad)
    with pytest.raises((ValueError, TypeError)):
        tree.draft([1] + bad, 4, 4)
    assert (tree.num_nodes, tree.num_tokens, tree.count([1, 2]), tree.sequence(seq)) == before
    tree.extend(seq, [3])
    assert tree.count([1, 2, 3]) == 2


@pytest.mark.parametrize("tree_cls", BACKENDS)
def test_defined_results_for_edge_cases(tree_cls):
    tree = tree_cls(4)
    assert tuple(tree.draft([], 5, 3)) == ([], [], [], 0)
    seq = tree.add_sequence()
    tree.extend(seq, [])
    tree.extend(seq, [5, 6, 5, 6])
    assert tuple(tree.draft([5], 0, 3)) == ([], [], [], 0)
    # "5" is always followed by 6; "56" occurs twice, once followed by 5: the other ends the sequence,
    # so it does not vote on what follows.
    assert tuple(tree.draft([5], 3, 3)) == ([6, 5, 6], [-1, 0, 1], [1.0, 1.0, 1.0], 1)
    assert tree.count([5, 6, 5, 6, 5]) == 0  # longer than max_depth
    tree.close(seq)
    with pytest.raises(ValueError, match="not open"):
        tree.extend(seq, [1])
    with pytest.raises(ValueError, match="not open"):
        tree.close(seq)
    with pytest.raises(ValueError):
        tree.extend(42, [1])
    with pytest.raises(ValueError):
        tree_cls(0)


def test_package_falls_back_to_the_reference_tree_without_the_extension():
    """With the compiled module unavailable the package still imports, warns, and works."""
    code = (
        "import sys, warnings\n"
        "sys.modules['srt_agent.drafting.trees._tree'] = None\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from srt_agent.drafting import make_drafter, ReferenceTokenTree\n"
        "    from srt_agent.drafting.trees.tree import tree_class\n"
        "assert any('pure-Python tree' in str(w.message) for w in caught), caught\n"
        "assert tree_class() is ReferenceTokenTree\n"
        "d = make_drafter('srt')\n"
        "d.start_request('r', 'p', [1, 2, 3])\n"
        "d.add_tokens('r', [4, 5])\n"
        "d.start_request('s', 'p', [1, 2, 3])\n"
        "print(d.draft('s', [1, 2, 3], 2).token_ids)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[4, 5]"
