"""`specgraft generate | demo | models | warmup | calibrate | tune | datastore | bench | report | serve | profile | bench-serve`: the command line.

Every failure a user can cause (bad value, unknown method, missing file, a model that cannot be
pulled or loaded) prints one line ``error: ...`` on stderr and exits with status 2; no tracebacks.
Start-up imports no torch: each command imports what it runs.
"""

from __future__ import annotations

import sys

import typer

from specgraft.cli.batch import bench_serve, profile
from specgraft.cli.bench import bench, report
from specgraft.cli.calibrate import calibrate
from specgraft.cli.datastore import datastore_app
from specgraft.cli.generate import DEMO_MODEL, DEMO_PROMPT, demo, err, generate, run_generate
from specgraft.cli.models import models_app, warmup
from specgraft.cli.serve import serve
from specgraft.cli.tune import tune

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Lossless speculative decoding for Hugging Face causal LMs.")
app.add_typer(models_app, name="models")
app.add_typer(datastore_app, name="datastore")
for command in (generate, demo, warmup, calibrate, tune, bench, report, serve, profile):
    app.command()(command)
app.command("bench-serve")(bench_serve)

__all__ = ["DEMO_MODEL", "DEMO_PROMPT", "app", "main", "run_generate"]


def main() -> None:
    try:
        app(standalone_mode=False)
    except (ValueError, OSError) as e:
        # OSError: missing or unwritable files, and models that cannot be pulled or loaded
        # (ModelLoadError: models.resolve.load_errors names the model); transformers' messages span
        # several lines, so whitespace is folded to print one line however narrow the terminal
        err.print("error: " + " ".join(str(e).split()), soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # click usage errors carry their own exit code
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Exit):
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
