"""The model runner's logits equal the plain transformers forward's, with and without draft trees,
for every verified architecture (its own layers, our tree attention)."""

from __future__ import annotations

import random

import pytest
import torch

from srt_agent.drafting import Draft
from srt_agent.engine import Engine, EngineOptions, SamplingParams
from srt_agent.models import tiny_random_model
from srt_agent.models.architectures import VERIFIED, UnsupportedModel
from srt_agent.runner.model_runner import Chunk, ModelRunner, check_model
from srt_agent.runner.tree_order import draft_order

TOKENS = [5, 17, 33, 2, 99, 140, 7, 64, 200, 3, 12, 250]


pytestmark = pytest.mark.usefixtures("one_thread")


# Where transformers computes in float32 inside a float64 model: Gemma 2's eager attention (the only
# one with soft-capping) takes its softmax in float32, MiniMax-M2 its RMS norms and router.
TOLERANCE = {"gemma2": 1e-5, "minimax_m2": 1e-6}


@pytest.fixture(params=sorted(VERIFIED))
def tiny(request):
    return tiny_random_model(request.param, seed=0)


def tol(model) -> float:
    return TOLERANCE.get(model.config.model_type, 1e-10)


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def test_prefill_in_pieces_and_batched(tiny):
    model = tiny.model
    runner = ModelRunner(model, num_slots=3, max_context=32, tree_margin=4, device=torch.device("cpu"))
    ref = hf_logits(model, TOKENS)
    first = runner.forward([Chunk(1, 0, TOKENS[:5], 5)])
    # Rest of slot 1 alongside a fresh prefill of a shorter sequence in slot 0.
    rest = runner.forward([Chunk(1, 5, TOKENS[5:], len(TOKENS) - 5), Chunk(0, 0, TOKENS[:3], 3)])
    got = runner.logits(torch.cat([first, rest[: len(TOKENS) - 5]]))
    torch.testing.assert_close(got, ref, rtol=0, atol=tol(model))
    torch.testing.assert_close(runner.logits(rest[len(TOKENS) - 5 :]), ref[:3], rtol=0, atol=tol(model))


def test_tree_rows_equal_each_path(tiny):
    """Every draft node's logits equal those of the sequence extended by its path."""
    model = tiny.model
    runner = ModelRunner(model, num_slots=2, max_context=32, tree_margin=8, device=torch.device("cpu"))
    prompt = TOKENS[:6]
    runner.forward([Chunk(0, 0, prompt[:-1], 5)])
    draft = Draft([10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 3, 1], [1.0] * 6)
    hidden = runner.forward([Chunk(0, 5, prompt[-1:] + draft.token_ids, 1, draft.parents)])
    logits = runner.logits(hidden)
    torch.testing.assert_close(logits[0], hf_logits(model, prompt)[-1], rtol=0, atol=tol(model))
    for node in range(len(draft)):
        path = prompt + draft.path_to(node)
        torch.testing.assert_close(logits[1 + node], hf_logits(model, path)[-1], rtol=0, atol=tol(model))


def test_padded_groups_equal_each_sequence(tiny):
    """Chunks of different lengths in one group (padded rows), a draft tree among them, each row's logits
    equal to the sequence's own forward (sliding windows included)."""
    model = tiny.model
    runner = ModelRunner(model, num_slots=3, max_context=32, tree_margin=8, device=torch.device("cpu"))
    first, second = TOKENS[:5], TOKENS[2:9]
    hidden = runner.forward([Chunk(2, 0, second, 7), Chunk(0, 0, first, 5)])  # one group: 7 and 5 rows
    torch.testing.assert_close(runner.logits(hidden[:7]), hf_logits(model, second), rtol=0, atol=tol(model))
    torch.testing.assert_close(runner.logits(hidden[7:]), hf_logits(model, first), rtol=0, atol=tol(model))
    draft = Draft([10, 11, 12, 13, 14], [-1, -1, 1, 0, 2], [1.0] * 5)
    more = [40, 41, 42, 43, 44]
    hidden = runner.forward([Chunk(0, 5, [6] + draft.token_ids, 1, draft.parents), Chunk(2, 7, more, 5)])
    logits = runner.logits(hidden)
    for node in range(len(draft)):
        path = first + [6] + draft.path_to(node)
        torch.testing.assert_close(logits[1 + node], hf_logits(model, path)[-1], rtol=0, atol=tol(model))
    torch.testing.assert_close(logits[6:], hf_logits(model, second + more)[7:], rtol=0, atol=tol(model))


def test_draft_order_intervals_are_the_ancestors():
    """Entry j is an ancestor-or-self of entry i exactly when enter[j] <= enter[i] < exit[j], for random
    trees in any node order below a run of pending tokens; depths count from the last pending token."""
    rng = random.Random(0)
    for _ in range(200):
        pending, nodes = rng.randint(1, 3), rng.randint(0, 12)
        parents = [rng.randint(-1, i - 1) for i in range(nodes)]
        depth, enter, exit_ = draft_order(pending, parents)
        enter, exit_ = list(range(pending)) + enter, [pending + nodes] * pending + exit_
        parent_of = list(range(-1, pending - 1)) + [pending + p if p >= 0 else pending - 1 for p in parents]
        for i in range(pending + nodes):
            ancestors, node = set(), i
            while node >= 0:
                ancestors.add(node)
                node = parent_of[node]
            assert {j for j in range(pending + nodes) if enter[j] <= enter[i] < exit_[j]} == ancestors
            if i >= pending:
                assert depth[i - pending] == len(ancestors) - pending
    with pytest.raises(ValueError, match="parents must precede"):
        draft_order(1, [-1, 2, 0])


def test_compaction_keeps_the_accepted_path(tiny):
    """After moving an accepted path's KV into place, the next token's logits are exact."""
    model = tiny.model
    runner = ModelRunner(model, num_slots=1, max_context=32, tree_margin=8, device=torch.device("cpu"))
    prompt = TOKENS[:4]
    draft = Draft([21, 22, 23, 24, 25], [-1, -1, 1, 1, 3], [1.0] * 5)  # accept nodes 1 → 3 → 4
    runner.forward([Chunk(0, 0, prompt + draft.token_ids, 4, draft.parents)])
    base = len(prompt)
    runner.move_kv([0, 0, 0], [base + 1, base + 3, base + 4], [base, base + 1, base + 2])
    path = prompt + [22, 24, 25]
    hidden = runner.forward([Chunk(0, len(path), [77], 1)])
    torch.testing.assert_close(runner.logits(hidden)[0], hf_logits(model, path + [77])[-1], rtol=0, atol=tol(model))


class ChainDrafter:
    """Drafts a fixed continuation, with a wrong sibling placed before every right node."""

    name = "chain"

    def __init__(self, full):
        self.full = full

    def start_request(self, request_id, prompt_key, prompt_ids):
        pass

    def add_tokens(self, request_id, token_ids):
        pass

    def draft(self, request_id, context, budget):
        truth = self.full[len(context) : len(context) + budget // 2]
        tokens, parents, parent = [], [], -1
        for t in truth:
            tokens += [(t + 1) % 256, t]  # the tiny models' vocabulary
            parents += [parent, parent]
            parent = len(tokens) - 1
        return Draft(tokens, parents, [1.0] * len(tokens))

    def stop_request(self, request_id):
        pass

    def end_step(self):
        pass


def test_engine_logprobs_equal_transformers(tiny):
    """End to end, after many accepted and compacted drafts, each emitted token's log-probability
    equals log_softmax of the transformers forward over the full sequence."""
    prompt = TOKENS[:5]
    params = SamplingParams(temperature=0.0, max_tokens=20)
    plain = Engine(tiny, EngineOptions(drafter=None, max_context=64)).generate([prompt], params)[0]
    full = prompt + plain.token_ids
    engine = Engine(
        tiny, EngineOptions(drafter=ChainDrafter(full), max_context=64, max_draft_tokens=8, adaptive_drafts=False)
    )
    out = engine.generate([prompt], params)[0]
    assert out.token_ids == plain.token_ids
    assert out.metrics.forwards < len(out.token_ids) // 2
    ref = torch.log_softmax(hf_logits(tiny.model, full), -1)
    expected = [float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(expected, abs=max(1e-9, tol(tiny.model)))
    sampled = Engine(tiny, EngineOptions(drafter=ChainDrafter(full), max_context=64, adaptive_drafts=False)).generate(
        [prompt], SamplingParams(temperature=0.7, max_tokens=10, seed=3)
    )[0]
    seq = prompt + sampled.token_ids
    ref = torch.log_softmax(hf_logits(tiny.model, seq) / 0.7, -1)
    expected = [float(ref[len(prompt) - 1 + i, t]) for i, t in enumerate(sampled.token_ids)]
    assert sampled.logprobs == pytest.approx(expected, abs=max(1e-9, tol(tiny.model)))


def test_sliding_windows_are_honoured():
    """With a window of 4, the windowed layers' logits differ from full attention's, and the runner
    matches the windowed ones (so the runner's equality above covers the window)."""
    windowed = tiny_random_model("mistral", seed=0).model
    full = tiny_random_model("mistral", seed=0).model
    full.config.sliding_window = None
    for layer in full.model.layers:
        layer.self_attn.config.sliding_window = None
    assert not torch.allclose(hf_logits(windowed, TOKENS), hf_logits(full, TOKENS))
    runner = ModelRunner(windowed, num_slots=1, max_context=32, tree_margin=4, device=torch.device("cpu"))
    got = runner.logits(runner.forward([Chunk(0, 0, TOKENS, len(TOKENS))]))
    torch.testing.assert_close(got, hf_logits(windowed, TOKENS), rtol=0, atol=1e-10)


def test_plain_transformers_use_is_unchanged():
    """After a runner takes the model, transformers' own forward (padding masks included) is unchanged."""
    model = tiny_random_model("llama", seed=0).model
    ids = torch.tensor([[0, 0, 5, 17, 33], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        before = model(ids, attention_mask=mask).logits
    ModelRunner(model, num_slots=1, max_context=8, tree_margin=0, device=torch.device("cpu"))
    with torch.no_grad():
        after = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_unsupported_model_is_rejected():
    with pytest.raises(UnsupportedModel, match="not a Hugging Face causal LM"):
        check_model(torch.nn.Linear(2, 2))
