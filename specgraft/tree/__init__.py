"""Trees: layout (mask, depths), merge/prune under a budget, token paths, rank templates."""

from specgraft.tree.build import merge_drafts, truncate_depth
from specgraft.tree.layout import TreeLayout, pending_ancestors, tree_layout

__all__ = ["TreeLayout", "merge_drafts", "pending_ancestors", "tree_layout", "truncate_depth"]
