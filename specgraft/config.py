"""Frozen, validated configuration objects and the method registry.

Every run prints its resolved config (``dataclasses.asdict``), so nothing is picked implicitly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence


SEED_LIMIT = 2**63
"""Seeds are integers in ``[0, SEED_LIMIT)``: what ``torch.Generator.manual_seed`` takes whole."""


def check_step_costs(step_costs: Sequence[float] | None) -> None:
    """``ValueError`` unless ``step_costs`` is None or two or more positive costs."""
    if step_costs is not None and (len(step_costs) < 2 or any(not c > 0.0 for c in step_costs)):
        raise ValueError(f"step_costs needs two or more positive costs (1 row, 2 rows, ...), got {list(step_costs)}")


@dataclass(frozen=True)
class SamplingConfig:
    """How the target's next-token distribution is turned into a token.

    ``temperature == 0`` means greedy decoding (argmax); top-k and top-p are then ignored.
    """

    temperature: float = 0.0
    """0 = greedy; otherwise logits are divided by it before softmax."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = off)."""
    seed: int | None = None
    """Seed of the sampling generator. With deterministic drafts (the default) a seed gives the
    tokens plain sampling with that seed gives, for every method, budget and batch; sampled
    drafts reproduce them only with the same tree sizes (:mod:`specgraft.batch.engine`)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenerationConfig:
    """Stopping rules and budget shared by every method."""

    max_new_tokens: int = 128
    """Stop after this many new tokens."""
    budget: int | None = None
    """Nodes verified per step (the papers' K); None = the method's ``default_budget`` (see
    ``methods.DEFAULT_BUDGETS``), filled in by :meth:`with_default_budget` before the engine runs."""
    stop_strings: tuple[str, ...] = ()
    """Stop when the decoded output contains one of these (the output is cut before it)."""
    stop_on_eos: bool = True
    """Stop after the model's end-of-sequence token(s) (the EOS is kept as the last new token).
    False: EOS is an ordinary token and generation runs to ``max_new_tokens`` (e.g. to time a
    fixed number of tokens)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {self.max_new_tokens!r}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise ValueError(f"budget must be an integer >= 1, got {self.budget!r}")

    def with_default_budget(self, default: int) -> "GenerationConfig":
        """This config with ``budget = default`` if it has none.

        >>> GenerationConfig().with_default_budget(8).budget, GenerationConfig(budget=3).with_default_budget(8).budget
        (8, 3)
        """
        return self if self.budget is not None else replace(self, budget=default)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
