"""Methods: their options (``options.py``, torch-free data), the registry (``registry.py``) and one
module per method family.

``from specgraft.methods import METHODS, MethodOptions, get_method`` keeps working; this package
imports no torch (the CLI reads the registry at start-up).
"""

from specgraft.methods.graft import GRAFT_METHODS, GraftOptions, preset_budget, with_sampled_drafts
from specgraft.methods.options import LEARNING, MethodOptions
from specgraft.methods.registry import (
    DEFAULT_BUDGETS,
    METHODS,
    MethodSpec,
    build_method,
    default_method,
    derived_budget,
    fixed_budget,
    get_method,
    method_budget,
    method_names,
    register,
    unregister,
)

__all__ = [
    "DEFAULT_BUDGETS",
    "GRAFT_METHODS",
    "GraftOptions",
    "LEARNING",
    "METHODS",
    "MethodOptions",
    "MethodSpec",
    "build_method",
    "default_method",
    "derived_budget",
    "fixed_budget",
    "get_method",
    "method_budget",
    "method_names",
    "preset_budget",
    "register",
    "unregister",
    "with_sampled_drafts",
]
