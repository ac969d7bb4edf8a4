"""The speculative decoding loop: prefill, then propose -> verify -> commit -> observe.

Reads like gpt-fast's ``generate.py``: each step is a named function. The engine works on token
ids; :mod:`specgraft.api` adds tokenizers, chat templates, stop strings and text streaming.
Everything that belongs to one sequence (its cache slot, context, drafters' states, sampling
generator, stats) is one :class:`SequenceState`; the engine itself holds only the target,
the drafters and the composer, which all sequences share.

Example::

    engine = SpecEngine(HFTarget(model), [PLDDrafter()], MergeComposer())
    for new_tokens in engine.stream_ids(prompt_ids, GenerationConfig(max_new_tokens=32)):
        ...                                   # lists of tokens, one list per step
    engine.last_stats.mat                      # tokens per step, bonus token included

or step by step (what a scheduler does with many sequences)::

    seq = engine.start(prompt_ids, config)
    while not seq.done:
        engine.step(seq)
    engine.finish(seq)
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Sequence

import torch

from specgraft.composers.base import Composer, MergeComposer
from specgraft.config import GenerationConfig
from specgraft.drafters.base import Drafter, propose_all
from specgraft.models.base import TargetModel
from specgraft.models.base import synchronize
from specgraft.tree.build import truncate_depth
from specgraft.types import DraftTree, GenerationStats, PrefillOutput, PrefillRequest, RowsOutput, StepResult
from specgraft.verify import verify


@dataclass(frozen=True, eq=False)
class ForwardTiming:
    """One target forward of a step: ``batch`` sequences x ``rows`` rows each (trees padded to
    one shape, root included), and its wall time. The sequences of that forward share the
    object (compare with ``is``); the batch budget policy corrects its cost table with it."""

    batch: int
    rows: int
    seconds: float
    used: int = 0
    """Rows the sequences fed before padding (``batch x rows - used`` were padding)."""


@dataclass
class SequenceState:
    """One sequence being generated: everything that is not shared between sequences."""

    slot: int
    """The target cache slot holding this sequence's KV rows."""
    config: GenerationConfig
    """The generation's config, budget resolved."""
    context: list[int]
    """Committed tokens, prompt included; the last one is the next step's root."""
    drafter_states: list[Any]
    """One state per drafter of the engine (``Drafter.begin``), in the engine's order."""
    generator: torch.Generator | None
    """Sampling generator (None when greedy)."""
    stats: GenerationStats
    eos: frozenset[int]
    """Tokens that end the sequence (empty with ``stop_on_eos=False``)."""
    started: float = 0.0
    done: bool = False
    """No more steps: EOS, ``max_new_tokens``, a stop, the context window's end, or finished."""
    finish_reason: str | None = None
    """Why it is done: ``"stop"`` (an EOS token), ``"length"`` (``max_new_tokens`` or the context
    window's end), ``"cancelled"`` (:meth:`SpecEngine.finish` before it was done); the text
    layer sets ``"stop"`` for a stop string."""
    released: bool = False
    """:meth:`SpecEngine.finish` has freed the slot and the drafters' states."""
    new_tokens: list[int] = field(default_factory=list)
    last_budget: int = 0
    """The budget the last step's drafters were given (0: plain decoding)."""
    last_tree_nodes: int = 0
    """Nodes the last step verified (its tree's size)."""
    last_accepted: list[int] = field(default_factory=list)
    """Tree indices of the nodes the last step accepted."""
    last_draft_s: float = 0.0
    """Drafting time of the last step (shared by a batch's sequences). A drafter's catch-up
    prefill (a draft model prefilling the prompt at its first proposal, or a backlog) counts as
    the sequence's prefill (``stats.prefill_s``), not as drafting."""
    last_forward: ForwardTiming | None = None
    """The target forward of the last step (shared by the sequences in it)."""
    last_catch_up: tuple[int, float] = (0, 0.0)
    """Tokens and seconds of the last step's drafter catch-up prefill (``(0, 0.0)``: none)."""
    optional_prefill: tuple[int, float] = (0, 0.0)
    """Prompt tokens and seconds of the optional prefill work this sequence's start paid for
    (Token Recycling's top-k of every prompt token: :attr:`SpecEngine.optional_prefill`);
    ``(0, 0.0)`` when it started without it, or its drafters have none."""
    plain_only: bool = False
    """Decode plainly for the sequence's whole life, probes included: a batch set it at admission
    because the tokens it has to generate cannot repay its drafters' optional prefill work
    (``BudgetPolicy.prefill_pays``); it started without that work, and drafting without it
    would gain less still."""
    primed: bool = True
    """The drafters have what a speculative start gives them (the prompt's prefill outputs
    they asked for) or have drafted since; False for a sequence started with
    ``speculative=False`` until its first drafting step."""
    unfilled: list[int] = field(default_factory=list)
    """Prompt tokens not yet in the target's cache: a fused start (:meth:`SpecEngine.start`)
    feeds them as a chain ahead of the root in the first step's forward, then this is empty."""
    deferred_prefill: bool = False
    """A fused start whose drafters' prefill outputs (hidden states) come with the first step's
    forward (``StepResult.prefill``); False once delivered."""


@dataclass(frozen=True)
class PrefillFusion:
    """When a prompt's prefill is fed as a chain ahead of the root in the first step's forward
    (:meth:`SpecEngine.start`) instead of a forward of its own.

    A prompt of up to ``max_rows`` rows (the root excluded) fuses whole; 0 = always prefill
    apart. With ``tail``, a longer prompt prefills its whole chunks of the target's
    ``prefill_chunk`` rows apart and fuses the rest when that fits in ``max_rows``: the forward
    that would have prefilled the last, partial chunk is saved, and no forward grows past a
    chunk plus a tree (on a CPU a 768-row forward costs more per row than a 512-row one: the
    fused 768-token prompt lost 0.4 s where a 512-token one won 0.5 s; with the CPU's 256-row
    chunks, start + first step of a 600-1,100-token prompt took 8-13% less than whole 512-row
    chunks apart, ``benchmarks/RESULTS.md``).

    >>> f = PrefillFusion(max_rows=320)
    >>> [f.head(n, chunk=512) for n in (300, 700, 1024, 1100, 1400)]
    [0, 512, None, 1024, None]
    >>> PrefillFusion(max_rows=320, tail=False).head(700, chunk=512) is None
    True
    """

    max_rows: int
    tail: bool = True

    OFF: ClassVar[PrefillFusion]

    def __post_init__(self) -> None:
        if self.max_rows < 0:
            raise ValueError(f"PrefillFusion.max_rows must be >= 0, got {self.max_rows}")

    @classmethod
    def for_device(cls, device: str) -> PrefillFusion:
        """The measured default. On a CPU a forward of many rows costs more per row (its
        activations leave the cache) than the saved forward is worth past ~350 tokens (1.5B,
        2-core Zen 5: 260-300-token prompts 0.04-0.37 s faster fused, a 385-token one 0.13-0.30 s
        slower, 700-1,060 tokens 0.5-1.5 s slower). On a GPU the fused forward is one CUDA graph
        (rows padded to a power of two) where the prefill runs eagerly: start + first step on an
        H200 (random bf16 1.5B, ``benchmarks/experiments/gpu/measure_fuse_length.py``) 0.14-0.45x
        of apart up to 1,536 tokens, 0.55-0.67x at 2,048, 0.80x at 3,072, 1.22x at 4,096.

        >>> PrefillFusion.for_device("cpu").max_rows, PrefillFusion.for_device("cuda:0").max_rows
        (320, 2048)
        """
        return cls(320 if device.startswith("cpu") else 2048 if device.startswith("cuda") else 512)

    def head(self, rows: int, chunk: int) -> int | None:
        """How many of a prompt's first ``rows`` rows (all its tokens but the root) to prefill
        apart when the rest ride in the first step's forward; None: prefill them all apart.
        ``chunk``: the target's rows per prefill forward (<= 0: unchunked)."""
        if rows <= self.max_rows:
            return 0
        if not self.tail or chunk <= 0:
            return None
        tail = rows % chunk
        return rows - tail if 0 < tail <= self.max_rows else None


PrefillFusion.OFF = PrefillFusion(max_rows=0)


class SpecEngine:
    """One target, some drafters, one composer: all shared by the sequences it generates."""

    def __init__(
        self,
        target: TargetModel,
        drafters: Sequence[Drafter],
        composer: Composer | None = None,
        method: str = "",
        eos_token_ids: Sequence[int] = (),
        default_budget: int = 8,
        fusion: PrefillFusion | None = None,
    ):
        """``fusion``: when a prompt's prefill rides in the first step's forward
        (:class:`PrefillFusion`); None = :meth:`PrefillFusion.for_device` of the target's device."""
        self.target = target
        self.drafters = list(drafters)
        self.composer = composer if composer is not None else MergeComposer()
        self.method = method or "+".join(d.name for d in self.drafters) or "ar"
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        # used when a GenerationConfig leaves the budget to the method (budget=None)
        self.default_budget = default_budget
        self.needs_hidden = any(d.needs_hidden for d in self.drafters)
        layers = {d.hidden_layer for d in self.drafters if d.needs_hidden}
        if len(layers) > 1:
            raise ValueError(f"drafters {[d.name for d in self.drafters]} need hidden states of different layers {sorted(layers, key=str)}")
        # the layer whose hidden states StepResult.hidden carries (None: the final layer's)
        self.hidden_layer = layers.pop() if layers else None
        self.last_stats = GenerationStats(method=self.method)
        self.fusion = fusion if fusion is not None else PrefillFusion.for_device(str(target.device))

    def _now(self) -> float:
        """Wall time after the device's queued work (a GPU timer must not read launch times)."""
        synchronize(self.target.device)
        return time.perf_counter()

    def _prefill_requests(self) -> tuple[PrefillRequest, PrefillRequest]:
        """What the drafters want from a prompt's prefill: what they need, and what they marked
        ``prefill_optional`` (work a sequence expected to decode plainly skips)."""
        required, optional = PrefillRequest(), PrefillRequest()
        for d in self.drafters:
            if d.prefill_optional:
                optional = optional.union(d.prefill_request())
            else:
                required = required.union(d.prefill_request())
        return required, optional

    @property
    def optional_prefill(self) -> bool:
        """Whether a speculative start costs more than a plain one: some drafter's optional
        prefill work asks for the prompt's top-k successors (the whole prompt's logits, 25-40%
        of a 1.5B prefill on a 2-core CPU) that no other drafter needs anyway. A batch weighs
        that work against what the request can gain from drafting
        (``BudgetPolicy.prefill_pays``); :attr:`SequenceState.optional_prefill` times it.
        """
        required, optional = self._prefill_requests()
        return optional.topk > required.topk

    # -- a sequence's life ---------------------------------------------------------------------

    def check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) == 0:
            raise ValueError("the prompt is empty")
        bad = next((t for t in prompt if not 0 <= int(t) < self.target.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} of the prompt is outside the vocabulary [0, {self.target.vocab_size})")
        if len(prompt) >= self.target.max_positions:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the model's context window is "
                f"{self.target.max_positions} tokens"
            )

    def start(
        self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig(), speculative: bool = True, fuse_prefill: bool = True
    ) -> SequenceState:
        """Prefill ``prompt`` in a new slot (every token but the last, the first root) and start
        the drafters' states.

        ``fuse_prefill``: when no drafter asks anything of the prefill (a draft model, PLD,
        plain decoding) and the prompt is short enough (:attr:`fusion`), the prompt
        is not prefilled here but fed as a chain of rows ahead of the root in the first step's
        forward (:attr:`SequenceState.unfilled`), the way Hugging Face's assisted generation
        verifies its first draft together with the prompt. One target forward fewer per
        generation (~0.3 s of a 1.5B model on a 2-core CPU, a few percent of a short answer);
        only the root's and the tree's rows get logits. The outputs are the same (the cache
        holds the same prompt rows, computed with the same causal visibility). That first
        forward's time counts as the sequence's prefill (``stats.prefill_s``: the time to its
        first verified tokens, as a separate prefill counted it up to the prompt's end). A batch
        passes ``False``: its other sequences' trees would be padded to the prompt's length. A
        longer prompt prefills its whole chunks here and fuses the rest (:meth:`fused_head`).

        A drafter that asks for hidden states only and sets ``deferred_prefill`` (AdaPLD) does
        not stop the fusing: the first step's forward returns the prompt rows' hidden states
        (``forward_batch(fill_outputs=True)``) and the drafter gets them with its first
        ``observe`` (``StepResult.prefill``), having proposed its first tree without them.

        ``speculative=False`` is for a sequence expected to decode plainly (a batch where
        speculation does not pay): the prefill skips what drafters marked ``prefill_optional``
        asked for (Token Recycling's top-k successors of every prompt token, 25-40% of a 1.5B
        prefill on this CPU), so such a sequence costs what plain decoding costs. It can still
        draft later, from what its drafters learn from then on. The output never depends on it.
        """
        seq, request = self._open(prompt, config, speculative)
        try:
            head = self.fused_head(len(prompt) - 1) if fuse_prefill and self.can_fuse(request) else None
            if head is None:
                prefill = self.target.prefill(seq.slot, list(prompt[:-1]), request)
            else:
                seq.unfilled, seq.deferred_prefill = list(prompt[head:-1]), request != PrefillRequest() and len(prompt) > 1
                # the head's rows (whole prefill chunks) apart; a drafter gets theirs at begin, the rest with the first step
                prefill = self.target.prefill(seq.slot, list(prompt[:head]), request) if head else PrefillOutput(deferred=seq.deferred_prefill)
            self._begin(seq, prompt, prefill, speculative)
        except BaseException:
            self.finish(seq)
            raise
        return seq

    def fused_head(self, rows: int) -> int | None:
        """:meth:`PrefillFusion.head` of this engine's fusion, with the target's prefill chunk."""
        return self.fusion.head(rows, self.target.prefill_chunk)

    def with_fusion(self, fusion: PrefillFusion) -> SpecEngine:
        """The same engine (target, drafters, composer shared) with another fusion rule: the
        twin a test or a measurement compares against, e.g. ``engine.with_fusion(PrefillFusion.OFF)``
        prefills every prompt apart."""
        twin = copy.copy(self)
        twin.fusion, twin.last_stats = fusion, GenerationStats(method=self.method)
        return twin

    def can_fuse(self, request: PrefillRequest) -> bool:
        """Whether a start with this prefill request may feed the prompt in the first step's
        forward: nothing is asked, or only what a forward returns (hidden states) of drafters
        that can wait for it (``deferred_prefill``) from a target that returns it."""
        if request == PrefillRequest():
            return True
        return (
            request.fusable
            and self.target.fill_outputs
            and all(d.deferred_prefill or d.prefill_request() == PrefillRequest() for d in self.drafters)
        )

    def start_many(
        self, starts: Sequence[tuple[Sequence[int], GenerationConfig, bool]]
    ) -> list[SequenceState | ValueError | RuntimeError]:
        """:meth:`start` (``fuse_prefill=False``) for several ``(prompt, config, speculative)``,
        as a batch admits them; returns each one's sequence, or the ``ValueError`` /
        ``RuntimeError`` that refused it (a bad prompt, no memory for the cache).

        When the target prefills batches (:attr:`HFTarget.batched_prefill <specgraft.models.hf.HFTarget>`,
        on a GPU) the prompts whose drafters ask nothing of the prefill go through one forward
        (``prefill_batch``) instead of one each: on a GPU a forward costs about the same for one
        prompt as for sixteen (launch-bound), so a batch admitting 16 requests waits for one
        prefill, not 16. The cache rows are the same prompts' rows computed in another batch
        shape (as batched decoding steps are). Otherwise each prompt is prefilled on its own.

        Example::

            a, b = engine.start_many([([5, 6, 7], GenerationConfig(), True), ([8, 9], GenerationConfig(), True)])
            engine.step_batch([a, b])   # both prompts in the cache after one prefill forward (GPU)
        """
        out: list[SequenceState | ValueError | RuntimeError | None] = [None] * len(starts)
        opened: list[tuple[int, SequenceState, PrefillRequest]] = []
        try:
            for i, (prompt, config, speculative) in enumerate(starts):
                try:
                    opened.append((i, *self._open(prompt, config, speculative)))
                except (ValueError, RuntimeError) as e:
                    out[i] = e
            # prompts (of more than the root) whose drafters ask nothing of the prefill
            together = [(i, seq) for i, seq, request in opened if request == PrefillRequest() and len(starts[i][0]) > 1]
            filled: set[int] = set()
            if self.target.batched_prefill and len(together) > 1:
                try:
                    self.target.prefill_batch([seq.slot for _, seq in together], [list(starts[i][0][:-1]) for i, _ in together])
                    filled = {i for i, _ in together}
                except (ValueError, RuntimeError) as e:  # e.g. out of memory: none of them starts
                    for i, seq in together:
                        self.finish(seq)
                        out[i] = e
                    opened = [o for o in opened if out[o[0]] is None]
            for i, seq, request in opened:
                prompt, _, speculative = starts[i]
                try:
                    prefill = PrefillOutput() if i in filled else self.target.prefill(seq.slot, list(prompt[:-1]), request)
                    self._begin(seq, prompt, prefill, speculative)
                except (ValueError, RuntimeError) as e:
                    self.finish(seq)
                    out[i] = e
                else:
                    out[i] = seq
        except BaseException:
            for i, seq, _ in opened:
                self.finish(seq)
            raise
        return out  # type: ignore[return-value]

    def _open(self, prompt: Sequence[int], config: GenerationConfig, speculative: bool) -> tuple[SequenceState, PrefillRequest]:
        """A new sequence in a new slot, room reserved, not prefilled; and what its prefill
        must return (the drafters' requests; the optional ones only when ``speculative``)."""
        self.check_prompt(prompt)
        config = config.with_default_budget(self.default_budget)
        generator = None
        if not config.sampling.greedy:
            generator = torch.Generator(device=self.target.device)
            if config.sampling.seed is None:
                generator.seed()  # a fresh seed, without reseeding torch's global generator
            else:
                generator.manual_seed(config.sampling.seed)
        seq = SequenceState(
            slot=self.target.allocate(),
            config=config,
            context=list(prompt),
            drafter_states=[],
            generator=generator,
            stats=GenerationStats(method=self.method, prompt_tokens=len(prompt)),
            eos=self.eos_token_ids if config.stop_on_eos else frozenset(),
            started=self._now(),
            primed=speculative,
        )
        self.last_stats = seq.stats
        try:
            self.target.reserve(min(len(prompt) + config.max_new_tokens + config.budget + 1, self.target.max_positions))
        except BaseException:
            self.finish(seq)
            raise
        required, optional = self._prefill_requests()
        return seq, (required.union(optional) if speculative else required)

    def _begin(self, seq: SequenceState, prompt: Sequence[int], prefill: PrefillOutput, speculative: bool) -> None:
        """After the prefill: the drafters' states, the prefill's time, done when nothing is to
        be generated."""
        if speculative and self.optional_prefill:
            seq.optional_prefill = (len(prompt) - 1, prefill.topk_s)
        for d in self.drafters:
            seq.drafter_states.append(d.begin(prompt, prefill, seq.config))
        seq.stats.prefill_s = self._now() - seq.started
        if seq.config.max_new_tokens == 0:
            seq.done, seq.finish_reason = True, "length"

    def step(self, seq: SequenceState) -> list[int]:
        """One speculative step; returns the tokens it emits (cut at EOS and ``max_new_tokens``)."""
        return self.step_batch([seq])[0]

    def step_batch(self, seqs: Sequence[SequenceState], budget: int | None | Sequence[int | None] = None) -> list[list[int]]:
        """One speculative step of every sequence in ``seqs``, with one target forward for all.

        Each sequence proposes its own tree (drafters that can, e.g. a draft model, draft for all
        of them in one forward per layer: ``propose_batch``); the trees are padded to one shape
        in one ``forward_batch`` (padding rows are masked out and never accepted); each sequence
        is then verified, committed and observed on its own, with its own sampling generator.
        So a sequence's output does not depend on what else is in the batch. ``budget`` caps
        every sequence's budget this step (0 = plain decoding: no drafting, the root alone);
        None leaves each sequence's own; a list gives one cap per sequence. Returns each
        sequence's emitted tokens (``[]`` for one that is done). Timings: each sequence's stats
        count the shared draft and forward time.
        """
        emitted: list[list[int]] = [[] for _ in seqs]
        live: list[tuple[int, SequenceState, int, int]] = []  # (index, seq, budget, max depth)
        caps = list(budget) if isinstance(budget, Sequence) else [budget] * len(seqs)
        if len(caps) != len(seqs):
            raise ValueError(f"{len(caps)} budgets for {len(seqs)} sequences")
        for b, (seq, cap) in enumerate(zip(seqs, caps)):
            seq.last_budget, seq.last_catch_up, seq.last_forward = 0, (0, 0.0), None  # this step's, also for one that does not run
            # positions left in the context window after the root
            room = self.target.max_positions - self.target.length(seq.slot) - len(seq.unfilled) - 1
            if seq.done or room < 0:
                seq.done = True
                continue
            remaining = seq.config.max_new_tokens - seq.stats.new_tokens
            cap = seq.config.budget if cap is None else min(seq.config.budget, cap)
            live.append((b, seq, min(cap, room), min(remaining - 1, room)))
        if not live:
            return emitted
        t0 = self._now()
        trees = self.propose_batch([seq for _, seq, _, _ in live], [n for *_, n, _ in live], [d for *_, d in live])
        t1 = self._now()
        # a drafter's one-off catch-up (a draft model prefilling a prompt) is prefill, not drafting
        catch_ups = [self._catch_up(seq) if n > 0 and d > 0 else (0, 0.0) for _, seq, n, d in live]
        # rows: a fused start's unfilled prompt (a chain), the root, the tree (node i = row k + 1 + i)
        fills = [len(seq.unfilled) for _, seq, _, _ in live]
        rows = [[*seq.unfilled, seq.context[-1], *tree.tokens] for (_, seq, _, _), tree in zip(live, trees)]
        parents = [[*range(-1, k - 1), k - 1, *(p + 1 + k for p in tree.parents)] for k, tree in zip(fills, trees)]
        outs = self.target.forward_batch(
            [seq.slot for _, seq, _, _ in live], rows, parents, output_hidden=self.needs_hidden, hidden_layer=self.hidden_layer,
            logits_from=fills if any(fills) else None, fill_outputs=any(seq.deferred_prefill for _, seq, _, _ in live),
        )
        t2 = self._now()
        draft_s = max(0.0, t1 - t0 - sum(s for _, s in catch_ups))
        forward = ForwardTiming(len(live), max(len(r) for r in rows), t2 - t1, sum(map(len, rows)))
        for (b, seq, n, d), tree, out, own, fill in zip(live, trees, outs, catch_ups, fills, strict=True):
            seq.last_budget = n if d > 0 else 0
            seq.primed = seq.primed or seq.last_budget > 0
            seq.stats.prefill_s += own[1] + (t2 - t1 if fill else 0.0)  # a fused start's forward is its prefill
            seq.last_forward, seq.last_catch_up = forward, own
            emitted[b] = self._finish_step(seq, tree, out, draft_s=draft_s, forward_s=0.0 if fill else t2 - t1)
        return emitted

    def _finish_step(self, seq: SequenceState, tree: DraftTree, out: RowsOutput, draft_s: float, forward_s: float) -> list[int]:
        """Verify, commit and observe one sequence's tree after the target scored it."""
        config, stats = seq.config, seq.stats
        remaining = config.max_new_tokens - stats.new_tokens
        t2 = self._now()
        result = verify(tree, out.logits, config.sampling, seq.generator)
        t3 = self._now()
        k = len(seq.unfilled)  # a fused start's prompt rows come first and are all kept
        self.target.commit(seq.slot, [*range(k), k, *(k + 1 + i for i in result.accepted)])
        seq.unfilled = []
        t4 = self._now()
        step = StepResult(
            root_token=seq.context[-1], tree=tree, verify=result, logits=out.logits, context=seq.context, hidden=out.hidden,
            prefill=out.fill if seq.deferred_prefill else None,
        )
        seq.deferred_prefill = False
        new = step.new_tokens
        seq.context.extend(new)
        self.observe(seq, step)
        t5 = self._now()
        emitted = self._cut(new, remaining, seq.eos)
        seq.new_tokens += emitted
        seq.last_tree_nodes, seq.last_accepted, seq.last_draft_s = len(tree), list(result.accepted), draft_s
        stats.record_step(step, len(emitted))
        stats.draft_s += draft_s
        stats.forward_s += forward_s
        stats.verify_s += t3 - t2
        stats.commit_s += t4 - t3
        stats.observe_s += t5 - t4
        stats.total_s = t5 - seq.started
        if emitted and emitted[-1] in seq.eos:
            seq.done, seq.finish_reason = True, "stop"
        elif len(emitted) < len(new) or stats.new_tokens >= config.max_new_tokens:
            seq.done, seq.finish_reason = True, "length"
        return emitted

    def finish(self, seq: SequenceState) -> None:
        """Free the sequence's slot and drafter states; its stats are final. Idempotent."""
        if seq.released:
            return
        if not seq.done:
            seq.finish_reason = "cancelled"
        seq.released = seq.done = True
        for d, state in zip(self.drafters, seq.drafter_states):
            d.end(state)
        self.target.release(seq.slot)
        seq.stats.total_s = self._now() - seq.started

    def _catch_up(self, seq: SequenceState) -> tuple[int, float]:
        """Tokens and seconds the drafters' last proposal spent on catch-up prefill."""
        spent = [d.catch_up(state) for d, state in zip(self.drafters, seq.drafter_states, strict=True)]
        return sum(t for t, _ in spent), sum(s for _, s in spent)

    def pending_prefill(self, seq: SequenceState) -> int:
        """Tokens the drafters would prefill apart at the sequence's next drafting step (a draft
        model's catch-up: the prompt at its first proposal, or a long backlog); 0 for drafters
        without such a cost."""
        return sum(d.pending_prefill(state, seq.context) for d, state in zip(self.drafters, seq.drafter_states, strict=True))

    # -- the steps -----------------------------------------------------------------------------

    def propose(self, seq: SequenceState, budget: int, max_depth: int) -> DraftTree:
        return self.propose_batch([seq], [budget], [max_depth])[0]

    def propose_batch(self, seqs: Sequence[SequenceState], budgets: Sequence[int], max_depths: Sequence[int]) -> list[DraftTree]:
        """Each sequence's tree: every drafter proposes for all sequences with a budget (in one
        call, :func:`~specgraft.drafters.base.propose_all`), then the composer builds each tree.
        A sequence with budget 0 (or no room below the root) decodes plainly: no drafter runs
        for it this step; drafters catch up from the context at their next proposal."""
        trees = [DraftTree.empty() for _ in seqs]
        active = [b for b, (n, d) in enumerate(zip(budgets, max_depths, strict=True)) if n > 0 and d > 0]
        if not self.drafters or not active:
            return trees
        per_drafter = [
            propose_all(d, [seqs[b].drafter_states[i] for b in active], [seqs[b].context for b in active], [budgets[b] for b in active])
            for i, d in enumerate(self.drafters)
        ]
        for j, b in enumerate(active):
            trees[b] = truncate_depth(self.composer.build([drafts[j] for drafts in per_drafter], budgets[b]), max_depths[b])
        return trees

    def observe(self, seq: SequenceState, step: StepResult) -> None:
        for d, state in zip(self.drafters, seq.drafter_states, strict=True):
            d.observe(state, step)

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

    # -- one sequence at a time ----------------------------------------------------------------

    def stream_ids(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig()) -> Iterator[list[int]]:
        """Yield the new tokens of each step until EOS or ``max_new_tokens``.

        EOS is included as the last token when it stops generation. With
        ``config.stop_on_eos=False`` EOS is an ordinary token and only ``max_new_tokens`` (or the
        context window) stops. ``self.last_stats`` is complete once the iterator is exhausted (or closed).
        """
        seq = self.start(prompt, config)
        try:
            while not seq.done:
                emitted = self.step(seq)
                if emitted:
                    yield emitted
        finally:
            self.finish(seq)

    def generate_ids(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig()) -> list[int]:
        """All new tokens at once; see :meth:`stream_ids`."""
        return [t for chunk in self.stream_ids(prompt, config) for t in chunk]
