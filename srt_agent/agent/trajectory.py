"""The output of one multi-turn episode, token-level and verl-compatible."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .env import ToolCallRecord

TRAJECTORY_FINISH_REASONS = ("done", "max_turns", "length", "context", "error")


@dataclass
class Trajectory:
    """One sampled episode.

    ``response_ids`` interleaves model tokens (``response_mask = 1``, their log-probs) with forced
    observation tokens (``response_mask = 0``, log-prob 0.0), as verl's ``AgentLoopOutput`` expects.
    ``num_turns`` counts model turns, ``observations`` the env's answers inserted between them.
    ``prompt`` holds the opening chat messages, ``messages`` the whole conversation (observations included).
    ``finish_reason`` is one of :data:`TRAJECTORY_FINISH_REASONS`.
    A session of the OpenAI-compatible server that branched is one rollout of several trajectories: the
    last carries the reward and holds the earlier ones in ``branches`` (each trains with that reward);
    ``branch_reason`` says why a branch did not extend the one before it.
    """

    request_id: str
    task_index: int
    sample_index: int
    prompt_ids: list[int]
    prompt: list[dict] = field(default_factory=list)
    prompt_key: str | None = None  # its prompt's tree key (``cache.keys``: of the first turn's tokens)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    reward: float = 0.0
    num_turns: int = 0
    observations: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_time_s: float = 0.0
    finish_reason: str = "done"
    error: str | None = None
    ground_truth: str = ""
    data_source: str = ""
    correct: bool | None = None  # the env's verdict on the final answer (None: it gave none)
    forwards: int = 0
    draft_proposed: int = 0
    draft_accepted: int = 0
    prefill_tokens: int = 0  # prompt and tool-output tokens the engine computed
    prefill_reused: int = 0  # prompt tokens whose KV came from a shared prefix
    wall_s: float = 0.0
    branch_reason: str | None = None  # why this branch of a server session started (None: the first)
    branches: list[Trajectory] = field(default_factory=list)  # the session's earlier branches, oldest first
    seed: int | None = None  # every turn's sampling seed: the token at position p drew noise keyed by (seed, p)

    def append(self, token_ids: list[int], logprobs: list[float] | None = None) -> None:
        """Add model tokens (with log-probs) or, when `logprobs` is None, forced tokens."""
        self.response_ids += token_ids
        if logprobs is None:
            self.response_mask += [0] * len(token_ids)
            self.response_logprobs += [0.0] * len(token_ids)
        else:
            if len(logprobs) != len(token_ids):
                raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs")
            self.response_mask += [1] * len(token_ids)
            self.response_logprobs += list(logprobs)

    def count(self, metrics) -> None:
        """Add one turn's engine counts (a RequestOutput's `metrics`): forwards, drafts, prefill."""
        self.forwards += metrics.forwards
        self.draft_proposed += metrics.draft_proposed
        self.draft_accepted += metrics.draft_accepted
        self.prefill_tokens += metrics.prefill_tokens
        self.prefill_reused += metrics.prefill_reused

    @property
    def model_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def chat_turns(self) -> int:
        """Turns as verl counts them (its ``num_turns``): the prompt, every model turn, every observation."""
        return 1 + self.num_turns + self.observations

    @property
    def tokens_per_forward(self) -> float:
        return self.model_tokens / self.forwards if self.forwards else 0.0

    def to_json(self) -> dict:
        """A JSON-ready dict (one line of the rollout JSONL)."""
        out = asdict(self)
        out["model_tokens"] = self.model_tokens
        out["tokens_per_forward"] = self.tokens_per_forward
        return out
