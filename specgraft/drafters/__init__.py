"""Drafters: one module per candidate source; the protocol and per-sequence state in ``base.py``."""

from specgraft.drafters.base import Drafter, Learning
from specgraft.drafters.pld import PLDConfig, PLDDrafter
from specgraft.drafters.recycling import RecyclingConfig, RecyclingDrafter, SuccessorMatrix

__all__ = ["Drafter", "Learning", "PLDConfig", "PLDDrafter", "RecyclingConfig", "RecyclingDrafter", "SuccessorMatrix"]
