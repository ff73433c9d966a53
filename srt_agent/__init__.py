"""srt-agent: fast, exactly on-policy multi-turn RL rollouts with Speculative Rollout over a Tree-structured cache.

Where things live, from the top down, as docs/architecture.md draws the floors: each part imports only parts
listed below it (tests/test_layout.py); nothing in the product imports the benchmarks or the CLI.

- ``cli/``: the ``srt-agent`` command, one module per command group.
- ``bench/``: every benchmark: workloads, side-by-side runs, rollout traces and their replay, plots.
- ``rl/``: the trainer: cold start, algorithms, the step loop, policy updates, checkpoints, reports.
- ``sources/``: environment sources, one module each (an Env class, an ``agent:`` function, verifiers,
  arithmetic, reasoning-gym, verl files); they run the controller or the server.
- ``serve/``: the OpenAI-compatible rollout server; ``integrations/``: verl and TRL (nothing below imports it).
- ``agent/``: the Env API, the multi-turn ReTool controller, parsing, rewards, rollouts.
- ``config/``: the env/run config (the YAML schema) and the registries of every name a YAML can use
  (estimators and losses, environment sources) with the ``Task`` they hand over; reading it needs no torch.
- ``backends/``: the rollout-backend seam, its registry and its two implementations, our engine and vLLM
  (``backends/vllm/``: everything vLLM, SRT as vLLM's speculative proposer included).
- ``engine/``: our engine: sequences, scheduler, verification, run-ahead, and its options.
- ``drafting/``: every drafter, their registry, the per-prompt trees and the choice of what to draft.
- ``runner/``: running a causal LM over token trees: model runner, KV cache, tree attention, sampler.
- ``models/``: model loading and the architectures the engine runs.
- ``tools/``: the code interpreter and its sandboxes, and the SandboxFusion-compatible server.
- ``files/``: atomic writes of files and folders (imports nothing of the package).
- ``registry/``: the one ``Registry`` shape every registry uses (imports nothing of the package).
"""

__version__ = "0.1.0"

from . import sources  # noqa: E402, F401 - the built-in environment sources register themselves (nothing heavy)
