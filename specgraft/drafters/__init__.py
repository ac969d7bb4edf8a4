"""Drafters: one module per candidate source."""

from specgraft.drafters.base import Drafter, NullDrafter
from specgraft.drafters.pld import PLDConfig, PLDDrafter
from specgraft.drafters.recycling import RecyclingConfig, RecyclingDrafter, SuccessorMatrix

__all__ = [
    "Drafter", "NullDrafter", "PLDConfig", "PLDDrafter", "RecyclingConfig", "RecyclingDrafter", "SuccessorMatrix",
]
