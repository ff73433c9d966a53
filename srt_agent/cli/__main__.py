"""`python -m srt_agent.cli …`: the same as the `srt-agent` command."""

from . import app

app(prog_name="srt-agent")
