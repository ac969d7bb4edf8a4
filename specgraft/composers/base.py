"""The composer interface and the default composer (merge in priority order)."""

from __future__ import annotations

from typing import Protocol, Sequence

from specgraft.tree.build import merge_drafts
from specgraft.types import Draft, DraftTree


class Composer(Protocol):
    def build(self, drafts: Sequence[Draft], budget: int) -> DraftTree:
        """One tree of at most ``budget`` nodes from the drafts (highest priority first)."""


class MergeComposer:
    """Merge drafts in the order given, deduplicating shared prefixes (``tree/build.py``)."""

    def build(self, drafts: Sequence[Draft], budget: int) -> DraftTree:
        if len(drafts) == 1 and len(drafts[0]) <= budget and drafts[0].scores is None and not drafts[0].anchor:
            d = drafts[0]
            # one drafter's tree within budget: nothing to merge (drafters never repeat a sibling)
            return DraftTree(
                tokens=d.tokens, parents=d.parents, sources=[d.source] * len(d), draft_probs=d.draft_probs,
                prob_rows=d.prob_rows, probe=d.probe,
            )
        return merge_drafts(drafts, budget)
