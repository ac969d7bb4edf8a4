"""The drafter: a draft model drafting a tree layer by layer in its own cache slot per sequence
(:class:`DraftModelDrafter`; the package's docstring describes its steps)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar, Generator, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.base import StatelessDrafter
from specgraft.models.base import synchronize
from specgraft.models.hf import HFTarget
from specgraft.tree.paths import token_paths
from specgraft.types import PrefillOutput, RowsOutput, StepResult, reindex
from specgraft.verify.processing import target_probs
from specgraft.drafters.draft_model.config import DraftTreeConfig, budget_depth, next_extend_cap
from specgraft.drafters.draft_model.pool import ModelDraft, copy_guess, keep_count, trim


def check_vocab(target_vocab: int | None, draft_vocab: int) -> None:
    """The draft model must score the target's token ids: same vocabulary size (same tokenizer)."""
    if target_vocab is not None and int(target_vocab) != int(draft_vocab):
        raise ValueError(
            f"the draft model's vocabulary has {draft_vocab} tokens but the target's has {target_vocab}; "
            "the draft model must use the target's tokenizer (e.g. a smaller model of the same family)"
        )


#: Longest n-gram the copy-ahead guess looks up (``DraftTreeConfig.copy_ahead``).
class DraftLanguageModel(Protocol):
    """What the drafter needs from the draft model: :class:`~specgraft.models.hf.HFTarget`'s slots
    and incremental rows (tests use table stubs)."""

    vocab_size: int
    max_positions: int
    device: torch.device

    def allocate(self) -> int: ...

    def release(self, slot: int) -> None: ...

    def length(self, slot: int) -> int: ...

    def prefill(self, slot: int, tokens: Sequence[int]) -> object: ...

    def forward_rows(self, slot: int, tokens: Sequence[int] | torch.Tensor, parent_rows: Sequence[int] | torch.Tensor) -> RowsOutput: ...

    def forward_batch(
        self, slots: Sequence[int], tokens: Sequence[Sequence[int] | torch.Tensor], parent_rows: Sequence[Sequence[int] | torch.Tensor]
    ) -> list[RowsOutput]: ...

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None: ...

    def discard(self, slot: int) -> None: ...


#: Tokens the draft has not cached beyond which a proposal prefills them first (its own chunked,
#: causal forward) instead of feeding them as a chain in the root forward, which a batch pads to.
CATCH_UP_CHAIN = 16


def _catches_up(committed: int, pending: int) -> bool:
    """Whether ``pending`` uncached tokens (the root included) after ``committed`` cached ones
    are prefilled apart (the prompt, or a backlog longer than ``CATCH_UP_CHAIN``) rather than
    fed in the root forward.

    >>> _catches_up(0, 600), _catches_up(580, 3), _catches_up(580, 40)
    (True, False, True)
    """
    return pending > 1 and (committed == 0 or pending > CATCH_UP_CHAIN)


@dataclass
class _Rows:
    """One draft forward a proposal asks for: new pending rows of its slot (``forward_rows``)."""

    tokens: Sequence[int] | torch.Tensor
    parents: Sequence[int] | torch.Tensor


@dataclass
class _Proposal:
    """The last proposal's nodes that have draft-cache rows, for ``observe``."""

    # (parent node, token) -> node, over the whole untrimmed pool
    index: dict[tuple[int, int], int]
    # node -> pending row of the draft's slot (only expanded nodes have one)
    rows: dict[int, int]
    # the root's pending row (the tokens caught up with come before it)
    root_row: int
    # (tree depth, extension nodes) when the tree was eligible for extension, else None
    extension: tuple[int, int] | None = None


@dataclass
class DraftState:
    """One sequence's side of the draft model: its cache slot and sampler."""

    slot: int | None
    """The draft cache slot, allocated at the first proposal (None until then)."""
    # the draft distribution of sampled children (None: top-k drafting)
    sampling: SamplingConfig | None
    generator: torch.Generator | None
    proposal: _Proposal | None = None
    # wall time of each draft forward of the last proposal (calibration reads it)
    forward_s: list[float] = field(default_factory=list)
    # wall time of the last proposal's catch-up prefill (0: none; not in forward_s)
    catch_up_s: float = 0.0
    # tokens that catch-up prefilled
    catch_up_tokens: int = 0
    # the most extension forwards of the next proposal (``DraftTreeConfig.extend_adapt``)
    extend_cap: int = 0


class DraftModelDrafter(StatelessDrafter):
    """EAGLE-2-style tree drafting with a separate draft model (source ``draft``).

    ``model`` is a loaded Hugging Face causal LM (or an :class:`HFTarget` around one, or a
    :class:`DraftLanguageModel`) whose vocabulary is the target's; ``target_vocab`` checks
    that. The model and its adapter are shared by every sequence; each sequence drafts in
    its own cache slot (:class:`DraftState`).
    """

    name: ClassVar[str] = "draft"

    def __init__(
        self,
        model: nn.Module | HFTarget | DraftLanguageModel,
        config: DraftTreeConfig = DraftTreeConfig(),
        target_vocab: int | None = None,
        max_nodes: int | None = None,
    ):
        """``max_nodes`` caps every proposal's budget (READER gives its draft tree ``draft-tree``'s
        budget and the rest of its own to retrieved paths); None = the step's budget."""
        self.lm: DraftLanguageModel = HFTarget(model) if isinstance(model, nn.Module) else model
        check_vocab(target_vocab, self.lm.vocab_size)
        if max_nodes is not None and max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0 (or None), got {max_nodes}")
        self.config = config
        self.max_nodes = max_nodes
        self._checkpoint_of = {d: j for j, d in enumerate(config.checkpoints)}

    def _capped(self, budget: int) -> int:
        return budget if self.max_nodes is None else min(budget, self.max_nodes)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> DraftState:
        """Start the sequence's state; its cache slot is allocated and the prompt prefilled at
        the first proposal (module docstring, step 1), so a sequence that never drafts costs the
        draft model nothing (measured: with the slot allocated at start, a batch of 8 pinned to
        budget 0 ran 3% slower than `ar`).

        The draft sampler's seed follows the generation's: ``sampling seed + 1 + config.seed``
        (never the sampling seed itself, so the two streams differ), and a fresh random seed when
        the generation has none. A fixed draft seed under a random sampling seed would draw the
        same children for the same context in every request while the verifier's draws vary:
        rejection sampling needs the children to be fresh draws, so that would bias the output.
        """
        sampled = self.config.sample and not config.sampling.greedy
        generator = None
        if sampled:
            generator = torch.Generator(device=self.lm.device)
            if config.sampling.seed is None:
                generator.seed()
            else:
                generator.manual_seed(config.sampling.seed + 1 + self.config.seed)
        return DraftState(slot=None, sampling=config.sampling if sampled else None, generator=generator, extend_cap=self.config.extend)

    def end(self, state: DraftState) -> None:
        if state.slot is not None:
            self.lm.release(state.slot)
            state.slot = None

    def propose(self, state: DraftState, context: Sequence[int], budget: int) -> ModelDraft:
        """The ``budget`` best nodes of :meth:`draft_pool` (see :func:`trim`)."""
        budget = self._capped(budget)
        if budget <= 0:
            if state.slot is not None:
                self.lm.discard(state.slot)
            state.proposal = None
            return ModelDraft(source=self.name, tokens=[], parents=[])
        pool = self.draft_pool(state, context, budget)
        return trim(pool, keep_count(pool, budget, self.config))

    def pending_prefill(self, state: DraftState, context: Sequence[int]) -> int:
        """Tokens the next proposal would prefill apart before drafting (its catch-up: the
        prompt at the first proposal, or a backlog longer than ``CATCH_UP_CHAIN`` tokens);
        0 when it would not. The batch budget policy weighs this cost against what drafting
        for the sequence's remaining tokens can save (``AdaptiveBudget.pays_back``)."""
        committed = 0 if state.slot is None else self.lm.length(state.slot)
        pending = len(context) - committed
        return pending - 1 if _catches_up(committed, pending) else 0

    def catch_up(self, state: DraftState) -> tuple[int, float]:
        """Tokens and seconds the last proposal's catch-up prefill took (``(0, 0.0)``: none)."""
        return state.catch_up_tokens, state.catch_up_s

    def _now(self) -> float:
        synchronize(self.lm.device)
        return time.perf_counter()

    def propose_batch(self, states: Sequence[DraftState], contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> list[ModelDraft]:
        """:meth:`propose` for several sequences, one draft forward per layer for all of them
        (``forward_batch`` over their slots) instead of one per sequence and layer.

        Each sequence drafts exactly as alone (its own gates, depth and sampler); a sequence
        whose drafting stopped sits out the later forwards. Worked example: three sequences,
        depth 4, the second gated after its root forward: forwards over 3, 2, 2, 2 slots.
        """
        budgets = [self._capped(b) for b in budgets]
        drafts: list[ModelDraft | None] = [None] * len(states)
        runs: dict[int, Generator[_Rows, RowsOutput, ModelDraft]] = {}
        requests: dict[int, _Rows] = {}
        for b, (state, context, budget) in enumerate(zip(states, contexts, budgets, strict=True)):
            if budget <= 0:
                drafts[b] = self.propose(state, context, budget)
                continue
            runs[b] = self._draft_steps(state, context, budget)
            self._advance(b, runs, requests, drafts, None)
        while requests:
            order = list(requests)
            t0 = self._now()
            outs = self.lm.forward_batch([states[b].slot for b in order], [requests[b].tokens for b in order], [requests[b].parents for b in order])
            elapsed = self._now() - t0
            requests.clear()
            for b, out in zip(order, outs, strict=True):
                states[b].forward_s.append(elapsed)
                self._advance(b, runs, requests, drafts, out)
        return [trim(d, keep_count(d, budget, self.config)) if budget > 0 else d for d, budget in zip(drafts, budgets, strict=True)]  # type: ignore[arg-type]

    @staticmethod
    def _advance(b: int, runs: dict, requests: dict, drafts: list, out: RowsOutput | None) -> None:
        """Run sequence ``b``'s drafting to its next forward request (or to its draft)."""
        try:
            requests[b] = runs[b].send(out)  # type: ignore[arg-type]
        except StopIteration as done:
            drafts[b] = done.value
            del runs[b]

    def draft_pool(self, state: DraftState, context: Sequence[int], budget: int | None = None) -> ModelDraft:
        """Every drafted node, layer after layer, before trimming to a budget (``budget``, when
        given, bounds the layers (:func:`budget_depth`) and the extension: a node the trim would
        drop is neither drafted nor extended)."""
        run = self._draft_steps(state, context, budget)
        out: RowsOutput | None = None
        while True:
            try:
                rows = run.send(out)  # type: ignore[arg-type]
            except StopIteration as done:
                return done.value
            t0 = self._now()
            out = self.lm.forward_rows(state.slot, rows.tokens, rows.parents)
            state.forward_s.append(self._now() - t0)

    def _draft_steps(self, state: DraftState, context: Sequence[int], budget: int | None = None) -> Generator[_Rows, RowsOutput, ModelDraft]:
        """The drafting of one proposal as a coroutine: it yields each draft forward it needs
        (:class:`_Rows`), is sent that forward's output, and returns the pool of nodes. The
        drivers (:meth:`draft_pool` one sequence, :meth:`propose_batch` many) run the forwards
        and time them."""
        if state.slot is None:
            state.slot = self.lm.allocate()  # first proposal: the slot (and its prefill, below)
        cfg, lm, slot = self.config, self.lm, state.slot
        lm.discard(slot)  # a proposal never verified (propose called twice)
        state.forward_s = []
        state.catch_up_s, state.catch_up_tokens = 0.0, 0
        state.proposal = None
        committed = lm.length(slot)
        if len(context) <= committed:
            raise ValueError(f"the context ({len(context)} tokens) is not a continuation of the {committed} the draft cached")
        full_depth = min(cfg.depth, lm.max_positions - len(context) - 1)
        depth = budget_depth(cfg, full_depth, budget)
        if depth < 1:
            return ModelDraft(source=self.name, tokens=[], parents=[], checkpoints=cfg.checkpoints)
        dev = lm.device
        # the tokens accepted since the last commit, then the root: a chain of pending rows
        pending = [int(t) for t in context[committed:]]
        if _catches_up(committed, len(pending)):
            # the prompt (first proposal) or a long plain-decoding stretch: prefill it apart (not
            # timed in forward_s, which is the per-forward drafting cost)
            t0 = self._now()
            lm.prefill(slot, pending[:-1])
            state.catch_up_s, state.catch_up_tokens = self._now() - t0, len(pending) - 1
            pending = pending[-1:]
        out = yield _Rows(pending, list(range(-1, len(pending) - 1)))
        # [1, V]
        log_q, q = self._distribution(state, out.logits[-1:])
        root_row = len(pending) - 1
        # the frontier: expanded nodes (node id, pending row, path score); the root is node -1
        frontier_nodes = torch.tensor([-1], device=dev)
        frontier_rows = torch.tensor([root_row], device=dev)
        frontier_scores = torch.zeros(1, device=dev)
        rows_fed = len(pending)
        # per layer, [layer nodes] each: token, parent node, path score, q row, kept (not a duplicate draw)
        layers: list[tuple[torch.Tensor, ...]] = []
        q_tables: list[torch.Tensor] = []
        expanded: list[tuple[torch.Tensor, torch.Tensor]] = []  # (node ids, pending rows)
        confidences: list[float] = []
        stage = None
        n_nodes = 0
        for layer in range(1, depth + 1):
            # [m, k]
            kids, kid_log_q, kept = self._children(state, log_q, q)
            m, k = kids.shape
            scores = (frontier_scores[:, None] + kid_log_q).masked_fill(~kept, float("-inf"))
            q_row = None
            if q is not None:
                q_row = (sum(t.shape[0] for t in q_tables) + torch.arange(m, device=dev)).repeat_interleave(k)
                q_tables.append(q)
            node_ids = n_nodes + torch.arange(m * k, device=dev)
            layers.append((kids.flatten(), frontier_nodes.repeat_interleave(k), scores.flatten(), q_row, kept.flatten()))
            n_nodes += m * k
            j = self._checkpoint_of.get(layer - 1)
            if j is not None:
                # c_d from the distributions, not from the children drawn (see module docstring)
                confidences.append(float((frontier_scores + log_q.max(dim=-1).values).max().exp()))
                if cfg.thresholds is not None and confidences[-1] <= cfg.thresholds[j]:
                    stage = j
                    break
            if layer == depth:
                break
            if cfg.stop_min > 0.0 and q is None and float(scores.max().exp()) < cfg.stop_min:
                break  # early stop: the deeper layers would hang from an unlikely path
            # EAGLE-2: expand the top_k nodes of the layer by path score (ties: the earlier node)
            flat = scores.flatten()
            order = torch.sort(flat, descending=True, stable=True).indices
            width = cfg.top_k if cfg.expand is None else cfg.expand
            take = min(width, m * k) if q is None else min(width, int(kept.sum()))  # sampled: never a duplicate
            order = order[:take]
            out = yield _Rows(kids.flatten()[order], frontier_rows[order // k])
            frontier_rows = rows_fed + torch.arange(take, device=dev)
            rows_fed += take
            frontier_nodes, frontier_scores = node_ids[order], flat[order]
            expanded.append((frontier_nodes, frontier_rows))
            log_q, q = self._distribution(state, out.logits)
        eligible = cfg.extend > 0 and stage is None and q is None and layer == full_depth
        room = min(state.extend_cap if cfg.extend_adapt else cfg.extend, lm.max_positions - len(context) - 1 - depth)
        chain = 0
        if eligible and room > 0:
            # Extension: continue the best leaf's path one node per forward (module docstring)
            flat = scores.flatten()
            best = int(flat.argmax())
            node, score = int(node_ids[best]), flat[best : best + 1]
            token, parent_row = kids.flatten()[best : best + 1], frontier_rows[best // k : best // k + 1]
            pool = torch.cat([s for _, _, s, *_ in layers])
            # copy-ahead: the context and the tip's path, which the guesses continue
            seq = None
            if cfg.copy_ahead:
                pool_paths = token_paths(torch.cat([t for t, *_ in layers]).tolist(), torch.cat([p for _, p, *_ in layers]).tolist())
                seq = np.array([*context, *pool_paths[node]], dtype=np.int64)

            def goes_on() -> bool:  # the plain chain feeds its tip for a child
                return chain < room and self._worth_extending(float(score), pool, budget)

            while goes_on():
                guess = [] if seq is None else copy_guess(seq, min(cfg.copy_ahead, room - chain - 1), cfg.copy_ngram)
                fed = token if not guess else torch.cat([token, torch.tensor(guess, device=dev)])
                out = yield _Rows(fed, torch.cat([parent_row, rows_fed + torch.arange(len(guess), device=dev)]))
                # [1 + len(guess)]: the draft's top child of each fed row
                top = torch.log_softmax(out.logits.float(), dim=-1).max(dim=-1)
                for i in range(len(guess) + 1):
                    # row i's output counts only while the plain loop would have fed row i
                    # (the guesses before it were the draft's own top tokens, and it would continue)
                    if i > 0 and (int(token) != guess[i - 1] or not goes_on()):
                        break
                    parent_row = torch.tensor([rows_fed + i], device=dev)
                    expanded.append((torch.tensor([node], device=dev), parent_row))
                    token, score = top.indices[i : i + 1], score + top.values[i : i + 1]
                    layers.append((token, torch.tensor([node], device=dev), score, None, torch.ones(1, dtype=torch.bool, device=dev)))
                    pool = torch.cat([pool, score])
                    node, n_nodes = n_nodes, n_nodes + 1
                    chain += 1
                    if seq is not None:
                        seq = np.append(seq, int(token))
                rows_fed += len(guess) + 1
        draft = self._to_host(state, layers, q_tables, expanded, root_row, stage, confidences)
        if eligible and state.proposal is not None:
            state.proposal.extension = (depth, chain)
        return draft

    def _worth_extending(self, score: float, pool: torch.Tensor, budget: int | None) -> bool:
        """Whether to feed the path's last node (path score ``score``, already in ``pool``) for
        a child: its path probability reaches ``extend_min``, and its child (which scores at
        most ``score``) could still enter the ``budget`` best nodes: the pool has room, or the
        node scores above the ``budget``-th best, which the child would displace.

        >>> d = DraftModelDrafter.__new__(DraftModelDrafter); d.config = DraftTreeConfig(extend=4, extend_min=0.3)
        >>> pool = torch.tensor([-0.1, -0.2, -0.9, -1.0])
        >>> [d._worth_extending(-0.9, pool, b) for b in (None, 2, 3, 4, 5)], d._worth_extending(-1.5, pool, None)
        ([True, False, False, True, True], False)
        """
        if math.exp(score) < self.config.extend_min:
            return False
        if budget is None or pool.numel() < budget:
            return True
        return score > float(torch.topk(pool, budget).values[-1])

    def _to_host(
        self,
        state: DraftState,
        layers: list[tuple[torch.Tensor, ...]],
        q_tables: list[torch.Tensor],
        expanded: list[tuple[torch.Tensor, torch.Tensor]],
        root_row: int,
        stage: int | None,
        confidences: list[float],
    ) -> ModelDraft:
        """The drafted layers as a :class:`ModelDraft` (one host transfer), duplicates dropped."""
        tokens = torch.cat([t for t, *_ in layers]).tolist()
        parents = torch.cat([p for _, p, *_ in layers]).tolist()
        scores = torch.cat([s for _, _, s, *_ in layers]).tolist()
        kept = torch.cat([k for *_, k in layers]).tolist()
        sampled = layers[0][3] is not None
        q_rows = torch.cat([r for *_, r, _ in layers]).tolist() if sampled else None
        sizes = [int(t.shape[0]) for t, *_ in layers]
        node_rows = {int(n): int(r) for ids, rows in expanded for n, r in zip(ids.tolist(), rows.tolist(), strict=True)}
        # a sampled duplicate (and anything under it) is not a node
        alive_of: list[bool] = []
        for i, p in enumerate(parents):
            alive_of.append(bool(kept[i]) and (p < 0 or alive_of[p]))
        keep = [i for i, ok in enumerate(alive_of) if ok]
        new_index = {old: new for new, old in enumerate(keep)}  # pool node -> kept node (for the rows map)
        layer_sizes: list[int] = []
        start = 0
        for size in sizes:
            layer_sizes.append(sum(alive_of[start : start + size]))
            start += size
        draft = ModelDraft(
            source=self.name,
            tokens=[tokens[i] for i in keep],
            parents=reindex(parents, keep),
            scores=None if sampled else [scores[i] for i in keep],
            draft_probs=torch.cat(q_tables) if sampled else None,
            prob_rows=[q_rows[i] for i in keep] if sampled else None,
            stage=stage,
            confidences=confidences,
            layer_sizes=layer_sizes,
            checkpoints=self.config.checkpoints,
        )
        state.proposal = _Proposal(
            index={(p, t): i for i, (p, t) in enumerate(zip(draft.parents, draft.tokens, strict=True))},
            rows={new_index[n]: r for n, r in node_rows.items() if n in new_index},
            root_row=root_row,
        )
        return draft

    def _distribution(self, state: DraftState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``log q`` ``[m, V]`` that path scores add up, and (sampling) ``q`` itself.

        Top-k drafting scores by the model's plain distribution; sampled drafts use the
        generation's processed one (what the verifier compares them with)."""
        if state.sampling is None:
            return torch.log_softmax(logits.float(), dim=-1), None
        q = target_probs(logits, state.sampling)
        return q.log(), q

    def _children(self, state: DraftState, log_q: torch.Tensor, q: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Children of each row of ``log_q`` (``[m, V]``): tokens ``[m, k]``, their log-probabilities
        and which are kept (a repeated draw is not).

        Top-k drafting: the ``top_k`` most likely tokens. Sampling: ``top_k`` i.i.d. draws from
        ``q``, of which the first appearance of each value is kept, in draw order.
        """
        k = min(self.config.top_k, log_q.shape[-1])
        if q is None:
            top = torch.topk(log_q, k, dim=-1)
            return top.indices, top.values, torch.ones_like(top.indices, dtype=torch.bool)
        # [m, k]
        draws = torch.multinomial(q, k, replacement=True, generator=state.generator)
        # [m, k, k]: draw j repeats an earlier draw j' < j
        earlier = torch.ones(k, k, dtype=torch.bool, device=draws.device).tril_(-1)
        repeat = ((draws[:, :, None] == draws[:, None, :]) & earlier).any(dim=-1)
        return draws, log_q.gather(-1, draws), ~repeat

    def observe(self, state: DraftState, step: StepResult) -> None:
        """Commit the caught-up tokens, the root and the accepted nodes this drafter had fed.

        Accepted tokens the draft never fed (retrieved nodes, leaves) are fed with the next root.
        """
        proposal, state.proposal = state.proposal, None
        if proposal is None:
            return
        # the accepted path through this drafter's pool; its leading nodes that were fed have rows
        path: list[int] = []
        for i in step.verify.accepted:
            child = proposal.index.get((path[-1] if path else -1, step.tree.tokens[i]))
            if child is None:
                break
            path.append(child)
        path_rows: list[int] = []
        for node in path:
            if node not in proposal.rows:
                break
            path_rows.append(proposal.rows[node])
        self.lm.commit(state.slot, [*range(proposal.root_row + 1), *path_rows])
        if proposal.extension is not None and self.config.extend_adapt:
            reached = len(path)
            state.extend_cap = next_extend_cap(state.extend_cap, self.config.extend, *proposal.extension, reached)
