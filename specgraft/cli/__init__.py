"""`specgraft generate | demo | models | warmup | calibrate | tune | datastore | bench | report | serve | profile | bench-serve`: the command line.

Every failure a user can cause (an unknown option or command, a missing or badly typed value, a
bad value, unknown method, missing file, a model that cannot be pulled or loaded) prints one line
``error: ...`` on stderr and exits with status 2; no tracebacks. Start-up imports no torch: each
command imports what it runs.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import typer

from specgraft.cli.batch import bench_serve, profile
from specgraft.cli.bench import bench, report
from specgraft.cli.calibrate import calibrate
from specgraft.cli.datastore import datastore_app
from specgraft.cli.generate import DEMO_PROMPT, demo, generate, run_generate
from specgraft.cli.options import DEMO_MODEL, err
from specgraft.cli.models import models_app, warmup
from specgraft.cli.serve import serve
from specgraft.cli.tune import tune

PROG = "specgraft"

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Lossless speculative decoding for Hugging Face causal LMs.")
app.add_typer(models_app, name="models")
app.add_typer(datastore_app, name="datastore")
for command in (generate, demo, warmup, calibrate, tune, bench, report, serve, profile):
    app.command()(command)
app.command("bench-serve")(bench_serve)

__all__ = ["DEMO_MODEL", "DEMO_PROMPT", "app", "main", "run_generate", "version"]


def version() -> str:
    """The installed distribution's version, else the package's ``__version__`` (a source tree
    on ``PYTHONPATH`` that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version(PROG)
    except PackageNotFoundError:
        import specgraft

        return specgraft.__version__


def _print_version(value: bool) -> None:
    if value:
        print(f"{PROG} {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print `specgraft <version>` and exit."
    ),
) -> None:
    """Lossless speculative decoding for Hugging Face causal LMs."""


def _click_exceptions():
    """The exceptions module of the click that typer runs on: its own copy (``typer._click``) in
    recent typer releases, else click itself. Its errors are not ``click.ClickException``s, which
    is why usage errors used to escape ``main`` as tracebacks."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


def command_path(args: Sequence[str]) -> str:
    """The (sub)command an argument list names, for the ``--help`` hint of a usage error: the
    leading words that are commands, options skipped.

    >>> command_path(["generate", "--model"]), command_path(["models", "pull"]), command_path(["--nope"])
    ('specgraft generate', 'specgraft models pull', 'specgraft')
    """
    command = typer.main.get_command(app)
    path = [PROG]
    for arg in args:
        sub = getattr(command, "commands", {}).get(arg)
        if sub is None:
            if arg.startswith("-"):
                continue
            break
        command = sub
        path.append(arg)
    return " ".join(path)


def usage_error_line(e: Exception, args: Sequence[str]) -> str:
    """One line for a click error: its message with whitespace folded, and for usage errors (bad
    options, arguments and commands) where to read the usage.

    >>> usage_error_line(_click_exceptions().NoSuchOption("--foo"), ["generate", "--foo"])
    "error: No such option: --foo (see 'specgraft generate --help')"
    """
    line = "error: " + " ".join(e.format_message().split())
    if isinstance(e, _click_exceptions().UsageError):
        line = line.rstrip(".") + f" (see '{command_path(args)} --help')"
    return line


def main(args: Optional[Sequence[str]] = None) -> None:
    """Run the command line on ``args`` (default ``sys.argv[1:]``) and exit with its status."""
    args = list(sys.argv[1:] if args is None else args)
    exceptions = _click_exceptions()
    try:
        # not standalone: click's and typer's own error printing (rich boxes, tracebacks for
        # errors typer does not know) is replaced by the one line below
        code = app(args, prog_name=PROG, standalone_mode=False)
    except (ValueError, OSError) as e:
        # OSError: missing or unwritable files, and models that cannot be pulled or loaded
        # (ModelLoadError: models.resolve.load_errors names the model); transformers' messages span
        # several lines, so whitespace is folded to print one line however narrow the terminal
        err.print("error: " + " ".join(str(e).split()), soft_wrap=True)
        sys.exit(2)
    except exceptions.ClickException as e:
        if isinstance(e, getattr(exceptions, "NoArgsIsHelpError", ())):
            # `specgraft` or `specgraft models` alone: the help, as --help prints it
            print(e.format_message())
            sys.exit(0)
        err.print(usage_error_line(e, args), soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):  # Ctrl-C: typer returns exit status 130, older click raises Abort
        code = 130
    if code == 130:
        err.print("interrupted")
        sys.exit(130)
    # not standalone, a command's return value comes back; --help and --version give 0
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
