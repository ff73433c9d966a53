"""`srt-agent …`: the command line, one module per command group; each command is a thin shell over a
library function.

`common` holds the Typer apps, the console and what the commands share; importing the command
modules registers their commands, in the order `srt-agent --help` lists them.
"""

from . import models, rollout, train, eval, serve, sandbox, bench, bench_rl, bench_trees, bench_numerics, bench_project  # noqa: F401, I001 - registers the commands, in this order
from .common import app

__all__ = ["app"]
