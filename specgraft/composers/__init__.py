"""Composers shape one tree from several drafts under one budget."""

from specgraft.composers.base import Composer, MergeComposer

__all__ = ["Composer", "MergeComposer"]
