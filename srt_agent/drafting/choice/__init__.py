"""What to draft at a batch size: the forward-cost model, the acceptance observed, vLLM's measured step cost."""
