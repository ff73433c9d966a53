"""The per-prompt rollout trees: the token tree (compiled, or the pure-Python reference), the cache of trees under
a byte budget, the prompt key and the held turns a trajectory's next turn continues."""
