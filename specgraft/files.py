"""Files that runs append to line by line (JSONL results and answers), kept readable after a kill."""

from __future__ import annotations

from pathlib import Path


def drop_partial_last_line(path: Path) -> bool:
    """Cut a last line without its newline (a write interrupted by a kill) off a JSONL file, so
    reading and appending start clean; whether there was one."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    path.write_bytes(data[: data.rfind(b"\n") + 1])
    return True
