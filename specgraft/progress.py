"""The command line's progress bar for runs of many generations (rich), shared by the benchmark,
the datastore answers and calibration-style loops."""

from __future__ import annotations

from rich.console import Console


def progress_bar(console: Console, enabled: bool):
    """The CLI's progress bar for runs of many generations (off: every call is a no-op)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(),
    )
    return Progress(*columns, console=console, disable=not enabled)
