"""verl integration (`pip install 'srt-agent[verl]'`, verl 0.9.x).

- `agent_loop`: ReToolAgentLoop, srt-agent's multi-turn controller as a verl agent loop (``srt_retool``).
- `replica`, `srt_server`, `adapter`, `plugin`: the ``srt`` rollout backend (``actor_rollout_ref.rollout.name=srt``),
  registered in every process through the ``verl.plugins`` entry point; `wire` converts at its boundary.
- `affinity`: prompt-affinity routing (consistent hashing) and tree migration; `srt_agent.bench.affinity` measures it.
- `tool`: the code-interpreter BaseTool; `reward`: ``compute_score`` with ReTool's turn shaping.

Importing this package imports nothing from verl; each module imports what it needs.
"""
