"""``python -m specgraft.cli ...``: the same as the ``specgraft`` command."""

from specgraft.cli import main

main()
