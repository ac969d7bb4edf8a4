"""Continuous batching under test: a budget policy that decides at random, and a random schedule."""

from __future__ import annotations

import random

from specgraft.batch import BatchEngine
from specgraft.budget.policy import FixedBudget, StepPlan
from specgraft.config import GenerationConfig


class RandomCap(FixedBudget):
    """A budget policy that caps the batch's budget at a random value each step (0 included),
    sometimes with one probing sequence (in its own forward or padded with the batch), starts
    sequences speculatively or not at random (refusing, at random, a start's optional prefill
    work: that sequence then never drafts), and at random refuses a sequence's catch-up (it
    then decodes plainly while the others draft, in the same forward or apart)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.observed = 0

    def pays_back(self, batch_size, budget, tokens, remaining):
        return self.rng.random() < 0.7

    def prefill_pays(self, batch_size, budget, tokens, remaining):
        return self.rng.random() < 0.7

    def split_pays(self, batch_size, drafting, budget):
        return self.rng.random() < 0.5

    def plan(self, batch_size, budgets, keys=None):
        cap = self.rng.choice([None, 0, 1, 3, 8])
        if cap == 0 and self.rng.random() < 0.5:
            return StepPlan(cap=0, probe=self.rng.choice([1, 4, 8]), split=self.rng.random() < 0.5)
        return StepPlan(cap=cap)

    def speculating(self, batch_size, budget):
        return self.rng.random() < 0.5

    def observe(self, batch_size, budget, tree_nodes, accepted, draft_s, key=None):
        self.observed += 1


def run_schedule(batch: BatchEngine, requests: list[tuple[list[int], GenerationConfig]], rng: random.Random) -> dict[str, list[int]]:
    """Submit requests at random steps (a few at a time), step until all are done."""
    todo = list(enumerate(requests))
    ids: dict[int, str] = {}
    outputs: dict[str, list[int]] = {}
    finished: set[str] = set()
    while todo or batch.has_work:
        for _ in range(rng.randint(0, 2)):
            if todo:
                i, (prompt, config) = todo.pop(0)
                ids[i] = batch.submit(prompt, config)
        for ev in batch.step():
            assert ev.request_id not in finished, "an event after the request finished"
            outputs.setdefault(ev.request_id, []).extend(ev.tokens)
            if ev.finished:
                finished.add(ev.request_id)
    assert finished == set(ids.values())
    return {str(i): outputs.get(ids[i], []) for i in ids}
