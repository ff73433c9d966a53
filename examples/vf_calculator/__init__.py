"""A small verifiers (>= 0.4) environment: arithmetic with a calculator tool, its rows shipped here.

``env: verifiers:vf_calculator`` (with ``examples/`` importable) runs it through srt-agent's server; see
envs/vf_calculator.yaml and docs/environments.md. It is a plain verifiers taskset package: verifiers' own
``vf-eval vf_calculator`` runs it too.
"""

from vf_calculator.taskset import CalculatorTaskset

__all__ = ["CalculatorTaskset"]
