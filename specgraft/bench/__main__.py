"""``python -m specgraft.bench --model M --suite spec-bench:3 --out DIR``: the bench command alone."""

import sys

import typer
from rich.console import Console

from specgraft.cli.bench import bench


def main() -> None:
    try:
        typer.run(bench)
    except (ValueError, FileNotFoundError) as e:
        Console(stderr=True, highlight=False).print(f"error: {e}", soft_wrap=True, markup=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
