"""Reading a command's progress lines (``LABEL [k/N] …``, one per finished unit) out of its captured output."""


def progress_lines(output: str, label: str) -> int:
    """How many progress lines of `label` `output` holds, checking that they count 1, 2, … up to their total."""
    counts = [line.split("[", 1)[1].split("]", 1)[0] for line in output.splitlines() if line.startswith(f"{label} [")]
    assert counts, f"no progress lines of {label!r} in:\n{output}"
    total = counts[-1].split("/")[1]
    assert counts == [f"{k}/{total}" for k in range(1, len(counts) + 1)], counts
    assert total == str(len(counts)), f"{len(counts)} lines for {total} units"
    return len(counts)
