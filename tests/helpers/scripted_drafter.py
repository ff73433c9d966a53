"""A drafter that drafts from known continuations, right, wrong or as a tree of both."""

from __future__ import annotations

from srt_agent.drafting import Draft


class ScriptedDrafter:
    """Drafts from known continuations (the plain run's outputs): right, wrong or a tree of both.

    mode "right": the true next tokens as a chain; "wrong": the true tokens shifted by one (always
    rejected); "tree": at every level a wrong sibling first, then the right token, chained under it.
    """

    name = "scripted"

    def __init__(self, continuations: list[list[int]], mode: str, vocab: int):
        self.continuations, self.mode, self.vocab = continuations, mode, vocab
        self.started: set = set()

    def start_request(self, request_id, prompt_key, prompt_ids):
        self.started.add(request_id)

    def add_tokens(self, request_id, token_ids):
        assert request_id in self.started

    def draft(self, request_id, context, budget):
        context = list(context)
        for full in self.continuations:
            if full[: len(context)] == context and len(full) > len(context):
                truth = full[len(context) : len(context) + budget]
                break
        else:
            return Draft()
        if self.mode == "right":
            return Draft(truth, list(range(-1, len(truth) - 1)), [0.9] * len(truth))
        if self.mode == "wrong":
            wrong = [(t + 1) % self.vocab for t in truth]
            return Draft(wrong, list(range(-1, len(wrong) - 1)), [0.9] * len(wrong))
        tokens, parents, parent = [], [], -1
        for t in truth:
            if len(tokens) + 2 > budget:
                break
            tokens += [(t + 7) % self.vocab, t]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return Draft(tokens, parents, [0.5] * len(tokens))

    def stop_request(self, request_id):
        self.started.discard(request_id)

    def end_step(self):
        pass
