"""Tree layout, merging and static templates."""

from specgraft.tree.build import merge_drafts
from specgraft.tree.layout import TreeLayout, tree_layout

__all__ = ["TreeLayout", "tree_layout", "merge_drafts"]
