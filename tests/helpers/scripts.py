"""The ``benchmarks/`` scripts, imported by path for tests (they are scripts, not a package), and
the repository root (``ROOT``) for tests that read its files or run commands in it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: the repository root (this file is tests/helpers/scripts.py)
ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def benchmark_script(name: str) -> ModuleType:
    """The script ``NAME.py`` of ``benchmarks/`` (package-data writers), ``benchmarks/tools/``
    (reusable tools) or ``benchmarks/experiments/*/`` (one-off records) as a module, loaded once
    and registered in ``sys.modules`` (its dataclasses look their module up there), e.g.
    ``benchmark_script("project_gpu")``. ``benchmarks/`` goes on ``sys.path`` first, as the
    scripts put it there themselves, so their ``tools.common`` imports resolve."""
    key = f"_specgraft_{name}"
    if key not in sys.modules:
        found = [BENCHMARKS / f"{name}.py", BENCHMARKS / "tools" / f"{name}.py", *sorted(BENCHMARKS.glob(f"experiments/*/{name}.py"))]
        path = next((p for p in found if p.exists()), None)
        assert path is not None, f"no benchmark script {name}.py under {BENCHMARKS}"
        if str(BENCHMARKS) not in sys.path:
            sys.path.insert(0, str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]
