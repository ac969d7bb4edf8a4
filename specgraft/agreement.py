"""Agreement of a method's output with plain decoding, position by position (``generate --compare``, the benchmark).

Greedy speculative decoding is lossless, so in fp32 every method's tokens equal plain decoding's.
In bf16 the batched tree pass and the one-token pass round differently and outputs can drift
apart after a near-tie, so the benchmark measures agreement instead of asserting it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class Agreement:
    """How ``tokens`` compare with the reference ``reference``.

    ``fraction_equal`` divides the equal positions by the longer length, so a shorter output
    counts its missing positions as unequal. ``first_divergence`` is None when the outputs are
    identical; a length mismatch diverges at the shorter length.
    """

    exact: bool
    first_divergence: int | None
    fraction_equal: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def agreement(tokens: Sequence[int], reference: Sequence[int]) -> Agreement:
    """Compare ``tokens`` with ``reference``.

    >>> agreement([1, 2, 3], [1, 2, 4])
    Agreement(exact=False, first_divergence=2, fraction_equal=0.6666666666666666)
    >>> agreement([1, 2], [1, 2, 3]).first_divergence
    2
    >>> agreement([5], [5]).exact
    True
    """
    n = max(len(tokens), len(reference))
    if n == 0:
        return Agreement(True, None, 1.0)
    same = sum(a == b for a, b in zip(tokens, reference))
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    if first is None and len(tokens) != len(reference):
        first = min(len(tokens), len(reference))
    return Agreement(exact=first is None, first_divergence=first, fraction_equal=same / n)
