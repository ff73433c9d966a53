"""srt-agent: fast, exactly on-policy multi-turn RL rollouts with Speculative Rollout over a Tree-structured cache.

Where things live, from the top down: each part imports only parts listed below it; nothing in the product
imports the benchmarks or the CLI.

- ``cli/``: the ``srt-agent`` command, one module per command group.
- ``bench/``: every benchmark: workloads, side-by-side runs, rollout traces and their replay, plots.
- ``rl/``: the trainer: cold start, algorithms (registries of advantage estimators and policy losses),
  the step loop, policy updates, checkpoints, reports.
- ``integrations/``: verl and TRL (an outer layer: nothing below imports it).
- ``sources/``: environment sources behind one registry (an Env class, an ``agent:`` function, verifiers,
  arithmetic, reasoning-gym, verl files); its registry and ``Task`` import nothing above them, so every
  layer reads them.
- ``agent/``: the Env API, the multi-turn ReTool controller, parsing, rewards, rollouts.
- ``backends/``: the rollout-backend seam, its registry and its two implementations, our engine and vLLM
  (``backends/vllm/``: everything vLLM, SRT as vLLM's speculative proposer included).
- ``engine/``: our engine: sequences, scheduler, drafting, verification, model runner, sampler, cost
  model, run-ahead.
- ``config.py``: the env/run config (the YAML schema); reading it needs no torch.
- ``cache/``: the per-prompt rollout trees and the drafters behind one interface.
- ``models/``: model loading and the architectures the engine runs.
- ``tools/``: the code interpreter and its sandboxes, and the SandboxFusion-compatible server.
- ``files/``: atomic writes of files and folders (imports nothing of the package).
"""

__version__ = "0.1.0"
