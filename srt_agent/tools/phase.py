"""One phase of a local sandbox's run (the program's, or its compiler's): what runs, with which limits and files."""

from __future__ import annotations

from dataclasses import dataclass

from .files import SCRATCH_IN_WORKDIR, workdir_relative
from .languages import Language


@dataclass
class Phase:
    """One phase of a run (the program's, or its compiler's), checked. `code` is the program's file: its
    source, or the compiled binary when `compiled`."""

    code: bytes
    stdin: str
    timeout: float
    limits: list[int]
    language: Language
    files: dict[str, bytes]
    fetch_files: list[str]
    memory_mb: int
    compiling: bool = False
    compiled: bool = False

    @property
    def program(self) -> str:
        return self.language.program_path(self.compiled)

    @property
    def uses_scratch(self) -> bool:
        """Whether the run's files or fetched files name /mnt (only then does the sandbox have it)."""
        return any(
            workdir_relative(name).startswith(f"{SCRATCH_IN_WORKDIR}/") for name in (*self.files, *self.fetch_files)
        )
