"""``python -m specgraft.cli ...``: the same as the ``specgraft`` command."""

from specgraft.cli import main

if __name__ == "__main__":
    main()
