"""The speculative decoding loop: prefill, then propose -> build -> verify -> commit -> observe.

Reads like gpt-fast's ``generate.py``: each step is a named function. The engine works on token
ids; :mod:`specgraft.api` adds tokenizers, chat templates, stop strings and text streaming.

Example::

    engine = SpecEngine(HFTarget(model), [PLDDrafter()], MergeComposer())
    for new_tokens in engine.stream_ids(prompt_ids, GenerationConfig(max_new_tokens=32)):
        ...                                   # lists of tokens, one list per step
    engine.last_stats.mat                      # tokens per step, bonus token included
"""

from __future__ import annotations

import time
from typing import Iterator, Sequence

import torch

from specgraft.composers.base import Composer, MergeComposer
from specgraft.config import GenerationConfig
from specgraft.drafters.base import Drafter
from specgraft.models.base import TargetModel
from specgraft.tree.build import truncate_depth
from specgraft.types import DraftTree, GenerationStats, StepResult
from specgraft.verify import verify


class SpecEngine:
    """One target, some drafters, one composer. Stateless between generations except for what
    drafters choose to keep (e.g. the successor matrix of Token Recycling)."""

    def __init__(
        self,
        target: TargetModel,
        drafters: Sequence[Drafter],
        composer: Composer | None = None,
        method: str = "",
        eos_token_ids: Sequence[int] = (),
        default_budget: int = 8,
    ):
        self.target = target
        self.drafters = list(drafters)
        self.composer = composer if composer is not None else MergeComposer()
        self.method = method or "+".join(d.name for d in self.drafters) or "ar"
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        # used when a GenerationConfig leaves the budget to the method (budget=None)
        self.default_budget = default_budget
        self.needs_hidden = any(d.needs_hidden for d in self.drafters)
        self.last_stats = GenerationStats(method=self.method)

    # -- the steps -------------------------------------------------------------------------

    def prefill(self, prompt: Sequence[int]) -> None:
        """Cache every prompt token but the last (the first root) and start the drafters."""
        self.target.reset()
        k = max((d.prefill_topk_k() for d in self.drafters), default=0)
        topk = self.target.prefill(list(prompt[:-1]), topk=k)
        for d in self.drafters:
            d.begin(prompt, topk)

    def propose(self, context: Sequence[int], budget: int, max_depth: int) -> DraftTree:
        drafts = [d.propose(context, budget) for d in self.drafters]
        if not drafts:
            return DraftTree.empty()
        tree = self.composer.build(drafts, budget)
        return truncate_depth(tree, max_depth)

    def observe(self, step: StepResult) -> None:
        for d in self.drafters:
            d.observe(step)

    # -- the loop --------------------------------------------------------------------------

    def check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) == 0:
            raise ValueError("the prompt is empty")
        if len(prompt) >= self.target.max_positions:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the model's context window is "
                f"{self.target.max_positions} tokens"
            )

    def stream_ids(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig()) -> Iterator[list[int]]:
        """Yield the new tokens of each step until EOS or ``max_new_tokens``.

        EOS is included as the last token when it stops generation. With
        ``config.stop_on_eos=False`` EOS is an ordinary token and only ``max_new_tokens`` (or the
        context window) stops. ``self.last_stats`` is complete once the iterator is exhausted (or closed).
        """
        self.check_prompt(prompt)
        config = config.with_default_budget(self.default_budget)
        eos = self.eos_token_ids if config.stop_on_eos else frozenset()
        stats = self.last_stats = GenerationStats(method=self.method, prompt_tokens=len(prompt))
        sampling = config.sampling
        generator = None
        if not sampling.greedy:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        t_start = time.perf_counter()
        try:
            self.prefill(prompt)
            stats.prefill_s = time.perf_counter() - t_start
            context = list(prompt)
            while stats.new_tokens < config.max_new_tokens:
                # positions left in the context window after the root
                room = self.target.max_positions - self.target.past_len - 1
                if room < 0:
                    break
                remaining = config.max_new_tokens - stats.new_tokens
                budget = min(config.budget, room)
                t0 = time.perf_counter()
                tree = self.propose(context, budget, max_depth=min(remaining - 1, room))
                t1 = time.perf_counter()
                out = self.target.forward_tree(context[-1], tree, output_hidden=self.needs_hidden)
                t2 = time.perf_counter()
                result = verify(tree, out.logits, sampling, generator)
                t3 = time.perf_counter()
                self.target.commit([0, *(i + 1 for i in result.accepted)])
                t4 = time.perf_counter()
                step = StepResult(root_token=context[-1], tree=tree, verify=result, logits=out.logits, context=context, hidden=out.hidden)
                new = step.new_tokens
                context.extend(new)
                self.observe(step)
                t5 = time.perf_counter()
                emitted = self._cut(new, remaining, eos)
                stats.record_step(step, len(emitted))
                stats.draft_s += t1 - t0
                stats.forward_s += t2 - t1
                stats.verify_s += t3 - t2
                stats.commit_s += t4 - t3
                stats.observe_s += t5 - t4
                yield emitted
                if len(emitted) < len(new) or (emitted and emitted[-1] in eos):
                    break
        finally:
            stats.total_s = time.perf_counter() - t_start

    @staticmethod
    def _cut(new: list[int], remaining: int, eos: frozenset[int]) -> list[int]:
        """Cut the step's tokens at ``max_new_tokens`` and after the first of ``eos``.

        >>> SpecEngine._cut([5, 2, 7], 8, frozenset({2})), SpecEngine._cut([5, 2, 7], 8, frozenset())
        ([5, 2], [5, 2, 7])
        """
        out = new[:remaining]
        for i, tok in enumerate(out):
            if tok in eos:
                return out[: i + 1]
        return out

    def generate_ids(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig()) -> list[int]:
        """All new tokens at once; see :meth:`stream_ids`."""
        return [t for chunk in self.stream_ids(prompt, config) for t in chunk]
