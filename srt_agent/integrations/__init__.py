"""Integrations with RL frameworks (each an optional extra)."""
