"""Reusable measurement tools for ``benchmarks/`` (scripts, not part of the ``specgraft`` package).

Scripts under ``benchmarks/`` put the ``benchmarks/`` folder on ``sys.path`` and import these as
``tools.common`` and ``tools.alternate``; the other modules here are command-line tools
(``python benchmarks/tools/NAME.py --help``), listed in ``benchmarks/README.md``.
"""
