"""What a long command shows on the console while it runs (progress.py): the one progress helper of every
command, trainer and benchmark alike."""

from .progress import Phase, PhaseUpdate, Progress, no_bar, phase_bar, progress

__all__ = ["Phase", "PhaseUpdate", "Progress", "no_bar", "phase_bar", "progress"]
