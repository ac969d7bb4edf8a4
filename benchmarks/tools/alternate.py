"""The alternating-order timing loop that the measurement scripts share.

A 2-core VM's speed drifts by 10-30% over minutes, more than most differences worth measuring.
Timing variants one after another in a fixed order charges that drift to whichever runs later;
running them in an order reversed from one prompt (or round) to the next charges a drift that is
linear over two prompts to every variant alike, and bracketing each prompt with ``ar`` before and
after gives each prompt its own baseline (the mean of the two)::

    for i, ids in enumerate(prompts):
        for name in alternate(["tree", "cut", "hf"], i):   # tree, cut, hf / hf, cut, tree / ...
            ...

``specgraft bench --rounds N`` and ``specgraft bench-serve --rounds N`` apply the same rule to
whole benchmark runs.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

from tools.common import timed_generate

T = TypeVar("T")


def alternate(items: Sequence[T], i: int) -> list[T]:
    """``items`` in order for an even ``i`` (a prompt's or a round's index), reversed for an odd one.

    >>> alternate(["a", "b", "c"], 0), alternate(["a", "b", "c"], 1), alternate(("a", "b"), 2)
    (['a', 'b', 'c'], ['c', 'b', 'a'], ['a', 'b'])
    """
    return list(items) if i % 2 == 0 else list(items)[::-1]


def bracketed_timings(base, variants, prompts, max_new_tokens: int) -> Iterator[tuple[int, float, float, dict]]:
    """Time each variant against ``ar`` per prompt, drift bracketed: for every prompt, ``ar``,
    then each variant (in an order that alternates from prompt to prompt), then ``ar`` again.
    ``variants``: ``(key, budget, decoder)``; greedy, exactly ``max_new_tokens`` tokens (EOS
    does not stop). Warms every decoder up first. Yields, per prompt, ``(i, ar_first, ar_last,
    {key: (seconds, MAT, output equals ar's)})``."""

    def run(dec, ids, budget=None, tokens=max_new_tokens):
        return timed_generate(dec, ids, tokens, budget)

    warm = base.encode("Say hello.", chat=True)
    for _, budget, dec in variants:
        run(dec, warm, budget, tokens=4)
    run(base, warm, tokens=4)
    for i, ids in enumerate(prompts):
        ar_first, ref = run(base, ids)
        timed = {}
        for key, budget, dec in alternate(variants, i):
            seconds, out = run(dec, ids, budget)
            timed[key] = (seconds, out.stats.mat, out.tokens == ref.tokens)
        ar_last, _ = run(base, ids)
        yield i, ar_first, ar_last, timed
