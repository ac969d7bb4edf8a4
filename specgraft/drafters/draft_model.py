"""Draft-model tree drafter (source ``draft``): a smaller LM with the target's vocabulary drafts a
tree the way EAGLE-2 does (Graft's base drafter, method ``draft-tree``).

One proposal, for the root token ``r`` (the last committed token):

1. **Root forward.** The draft model's cache holds every committed token but the root, like the
   target's. Tokens accepted last step that the draft has not cached yet (retrieved ones, or
   the leaf it never fed) are fed in the same forward as ``r``, so catching up costs nothing.
2. **Layers.** Layer 1 is the ``top_k`` most likely tokens after ``r``. Each deeper layer comes
   from *one* draft forward over the ``top_k`` best nodes of the previous layer (tree attention:
   each fed row sees the cache, its ancestors and itself), each contributing its ``top_k``
   most likely children. A node's path score is the cumulative log-probability
   ``S(child) = S(parent) + log q(child | path)`` (Graft eq. 5), so ``depth`` layers cost
   ``depth`` forwards.
3. **Rerank.** The ``budget`` best nodes by path score are kept, best-first, a node only after
   its parent (``S`` never increases along a path, so this is the plain top-``budget``).

Worked example, ``top_k = 2``, ``depth = 2``, root ``r``: the root forward gives
``q(a) = 0.6, q(b) = 0.3`` -> layer 1 ``[a, b]`` with scores ``[log .6, log .3]``; one forward
over ``[a, b]`` gives children ``a -> {c: .5, d: .4}``, ``b -> {e: .9, f: .05}``, so layer 2
is ``[c, d, e, f]`` with scores ``log [.30, .24, .27, .015]``. With ``budget = 4`` the tree
keeps ``a, b, c, e`` (nodes by score: a .6, b .3, c .30, e .27).

**Confidence checkpoints (Graft eq. 6-7).** After the forward that produced layer ``d + 1``
the drafter knows ``c_d = exp(max over the nodes of layer d + 1 of S)`` (``d = 0``: the root's
top-1 probability). For every configured checkpoint ``d`` it records ``c_d``; with thresholds
set, ``c_d <= tau_d`` stops drafting there (no deeper forwards) and the draft reports the
checkpoint as its ``stage``, which :class:`~specgraft.composers.graft.GraftComposer` turns into
a smaller draft share of the budget. ``c_d`` is computed from the distributions at layer
``d`` (``max_t S(parent) + log q(t | parent)``), which is eq. 6 exactly for top-k children and,
for sampled children, keeps the decision independent of the sampled values (see below).

**Sampling mode** (``sample=True``). Each expanded node's children are the distinct values of
``top_k`` i.i.d. draws from ``q`` (in order of first appearance) and every child carries ``q``
as its ``draft_probs`` row, so the verifier can use recursive rejection sampling. That rule is
exact only if a node's children list is a value-independent prefix of such draws; so in this
mode nothing cuts or reorders children by their own scores: the budget keeps the first
``budget`` nodes in creation order (layer by layer, parents in score order), and ``scores`` are
left out of the draft (the merge would otherwise admit siblings by score and reorder them).
Which nodes get *expanded* may depend on their own scores: that only shapes their children
lists, which are then drawn fresh. The gates are the one place where sampled values decide
a cut: ``c_d`` reads the values of layers ``1 .. d``, so Graft never lets a stage-dependent
cut fall inside those layers (``GraftComposer.draft_nodes``), and decides which rule a node
uses from what every stage would offer there (``tree/build.merge_drafts``).
``tests/test_sampling_exact.py`` proves this by enumerating every draw on a 4-token
vocabulary. In the default deterministic mode no ``draft_probs`` are set (sampling then
verifies by sample-and-match, exact for any candidates).

**Presets.** ``PRESETS["gpu"]`` is the paper's setting (depth 8, top-k 10, 60 nodes,
checkpoints after the root, depth 1 and depth 5). ``PRESETS["cpu"]`` (depth 4, top-k 2, 8
nodes, checkpoints after the root and depths 1 and 2; the last forward never saves anything by
stopping) was measured on the 2-core AVX2 host, fp32 with prepacked oneDNN linears: a 1.5B
target step costs ~0.3 s and every extra verified row ~0.03 s (8 nodes: ~1.8 steps), a 0.5B
draft forward ~0.13-0.19 s. So width is not free here as on a GPU, and a draft layer is about
half a target step. Over one mt_bench, one summarization and one HumanEval prompt (64 greedy
tokens) depth 4 / top-k 2 / 8 nodes gave 0.95x / 0.93x / 1.68x (MAT 2.9 / 4.0 / 4.3), depth 3 /
top-k 1 / 4 nodes 0.94x / 1.05x / 1.64x and depth 2 / top-k 3 / 6 nodes 1.03x / 0.95x / 1.92x:
differences within this machine's noise. The deeper shape is kept because it leaves Graft's
checkpoints the most draft forwards to save (``specgraft calibrate`` then prunes when drafting
does not pay).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence

import torch
from torch import nn

from specgraft.cache.commit import commit_cache
from specgraft.models.hf import HFTarget
from specgraft.types import Draft, StepResult


def check_vocab(target_vocab: int | None, draft_vocab: int) -> None:
    """The draft model must score the target's token ids: same vocabulary size (same tokenizer)."""
    if target_vocab is not None and int(target_vocab) != int(draft_vocab):
        raise ValueError(
            f"the draft model's vocabulary has {draft_vocab} tokens but the target's has {target_vocab}; "
            "the draft model must use the target's tokenizer (e.g. a smaller model of the same family)"
        )


@dataclass(frozen=True)
class DraftTreeConfig:
    """Shape and gating of the draft tree; ``depth`` and ``top_k`` default to ``PRESETS["cpu"]``'s."""

    depth: int = 4
    """Draft layers, i.e. draft forwards per step (the root forward makes layer 1)."""
    top_k: int = 2
    """Children per expanded node, and nodes expanded per layer (EAGLE-2's top-k)."""
    checkpoints: tuple[int, ...] = ()
    """Depths ``d`` after which the confidence ``c_d`` is checked (0 = the root step); each must be < depth."""
    thresholds: tuple[float, ...] | None = None
    """``tau_d`` per checkpoint: drafting stops when ``c_d <= tau_d``. None = record ``c_d`` only, never stop."""
    sample: bool = False
    """Draw children i.i.d. from the draft distribution and attach ``draft_probs`` (for rejection sampling)."""
    temperature: float = 1.0
    """The draft distribution is ``softmax(logits / temperature)`` (scores and sampling)."""
    seed: int = 0
    """Seed of the drafter's own generator (sampling mode); reseeded at every ``begin``."""

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or any(d < 0 for d in self.checkpoints):
            raise ValueError(f"checkpoints must be distinct increasing depths >= 0, got {self.checkpoints}")
        if self.checkpoints and self.checkpoints[-1] >= self.depth:
            raise ValueError(f"checkpoint {self.checkpoints[-1]} needs depth > {self.checkpoints[-1]}, got depth {self.depth}")
        if self.thresholds is not None:
            if len(self.thresholds) != len(self.checkpoints):
                raise ValueError(f"{len(self.thresholds)} thresholds for {len(self.checkpoints)} checkpoints")
            if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
                raise ValueError(f"thresholds must lie in [0, 1], got {self.thresholds}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class DraftPreset:
    depth: int
    top_k: int
    checkpoints: tuple[int, ...]
    """Graft's pruning checkpoints for this depth."""
    thresholds: tuple[float, ...]
    """Uncalibrated default ``tau_d`` (Graft Table 11, Qwen3-8B medians); ``specgraft calibrate`` replaces them."""
    budget: int
    """The verification budget this preset is meant for: a generation that gives no budget
    verifies this many nodes per step (``methods_graft.preset_budget``)."""


PRESETS: dict[str, DraftPreset] = {
    "gpu": DraftPreset(depth=8, top_k=10, checkpoints=(0, 1, 5), thresholds=(0.14, 0.14, 0.49), budget=60),
    "cpu": DraftPreset(depth=4, top_k=2, checkpoints=(0, 1, 2), thresholds=(0.14, 0.14, 0.49), budget=8),
}


def get_preset(name: str) -> DraftPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown draft preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


@dataclass
class ModelDraft(Draft):
    """A draft-model tree plus what Graft's composer needs to know about how drafting went."""

    stage: int | None = None
    """Index of the checkpoint whose gate failed (drafting stopped there); None = not pruned."""
    confidences: list[float] = field(default_factory=list)
    """``c_d`` of each checkpoint evaluated, in checkpoint order."""
    layer_sizes: list[int] = field(default_factory=list)
    """Nodes per depth before trimming to the budget (nodes are stored layer after layer)."""
    checkpoints: tuple[int, ...] = ()
    """The drafter's checkpoint depths (``stage`` indexes them)."""

    def subset(self, keep: Sequence[int]) -> "ModelDraft":
        """The nodes ``keep`` (ascending, closed under parents), reindexed."""
        new_index = {old: new for new, old in enumerate(keep)}
        return ModelDraft(
            source=self.source,
            tokens=[self.tokens[i] for i in keep],
            parents=[new_index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
            scores=[self.scores[i] for i in keep] if self.scores is not None else None,
            draft_probs=self.draft_probs[list(keep)] if self.draft_probs is not None else None,
            stage=self.stage,
            confidences=list(self.confidences),
            layer_sizes=list(self.layer_sizes),
            checkpoints=self.checkpoints,
        )


def best_first(parents: Sequence[int], scores: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` best nodes by score, admitting a node only after its parent (ascending).

    >>> best_first([-1, -1, 0, 1], [-0.5, -1.2, -0.7, -1.3], 3)
    [0, 1, 2]
    """
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    heap = [(-scores[i], i) for i in children[0]]
    heapq.heapify(heap)
    kept: list[int] = []
    while heap and len(kept) < n:
        _, i = heapq.heappop(heap)
        kept.append(i)
        for c in children[i + 1]:
            heapq.heappush(heap, (-scores[c], c))
    return sorted(kept)


def trim(draft: ModelDraft, n: int) -> ModelDraft:
    """Keep ``n`` nodes: the best by path score, or, for sampled drafts (no scores), the first ``n``.

    The second rule cuts every children list to a prefix whose length does not depend on the
    children's own values, which rejection sampling needs (module docstring).
    """
    if len(draft) <= n:
        return draft
    if draft.scores is None:
        return draft.subset(range(max(n, 0)))
    return draft.subset(best_first(draft.parents, draft.scores, n))


class DraftLanguageModel(Protocol):
    """What the drafter needs from the draft model: :class:`DraftLM` (tests use table stubs)."""

    vocab_size: int
    committed: list[int]

    def begin(self, prompt: Sequence[int]) -> None: ...

    def room(self, context: Sequence[int]) -> int: ...

    def start(self, context: Sequence[int]) -> torch.Tensor: ...

    def expand(self, tokens: Sequence[int], parent_rows: Sequence[int]) -> torch.Tensor: ...

    def commit(self, path_rows: Sequence[int]) -> None: ...

    def discard(self) -> None: ...


class DraftLM:
    """The draft model's side: an :class:`HFTarget` (model + ``DynamicCache``) fed row by row.

    The cache holds ``committed`` (every committed token but the root) and then the rows of the
    current proposal, numbered from 0 (the root); ``commit`` keeps the root and the accepted
    path with the target's commit operation (``cache/commit.py``), ``discard`` drops them.

    Example::

        lm = DraftLM(model); lm.begin(prompt)       # caches prompt[:-1]
        root_logits = lm.start(prompt)              # row 0 = the root
        logits = lm.expand([5, 9], [0, 0])          # rows 1, 2: two children of the root
        logits = lm.expand([4], [1])                # row 3: child of row 1 (token 5)
        lm.commit([1, 3])                           # root, 5, 4 accepted: cache += [root, 5, 4]
    """

    def __init__(self, model: nn.Module | HFTarget):
        self.hf = model if isinstance(model, HFTarget) else HFTarget(model)
        self.vocab_size = self.hf.vocab_size
        self.device = self.hf.device
        self.committed: list[int] = []
        # per proposal row (row 0 = root): its token and the rows of its ancestors
        self._tokens: list[int] = []
        self._ancestors: list[list[int]] = []

    def begin(self, prompt: Sequence[int]) -> None:
        self.hf.reset()
        self._tokens, self._ancestors = [], []
        self.hf.prefill(list(prompt[:-1]))
        self.committed = list(prompt[:-1])

    def room(self, context: Sequence[int]) -> int:
        """Draft depth that still fits in the draft model's context window after ``context``."""
        return self.hf.max_positions - len(context)

    def discard(self) -> None:
        """Drop the rows of an uncommitted proposal."""
        if self._tokens:
            self.hf.cache.crop(-len(self._tokens))
            self._tokens, self._ancestors = [], []

    @torch.inference_mode()
    def start(self, context: Sequence[int]) -> torch.Tensor:
        """Catch up with ``context`` and feed the root (row 0); returns its logits ``[V]``."""
        self.discard()
        n = len(self.committed)
        if len(context) <= n or list(context[:n]) != self.committed:
            self.begin(context)  # not a continuation of what we cached: start over
        pending = list(context[len(self.committed) : -1])
        ids = [*pending, int(context[-1])]
        m = len(ids)
        pos = list(range(self.hf.past_len, self.hf.past_len + m))
        hidden = self._forward(ids, pos, torch.ones(m, m, dtype=torch.bool).tril_())
        # the caught-up tokens are committed at once; the root stays a proposal row
        self.hf.past_len += len(pending)
        self.committed += pending
        self._tokens, self._ancestors = [ids[-1]], [[]]
        return self._logits(hidden[-1:])[0]

    @torch.inference_mode()
    def expand(self, tokens: Sequence[int], parent_rows: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens[i]`` as a child of row ``parent_rows[i]``; returns their logits ``[n, V]``."""
        old, n = len(self._tokens), len(tokens)
        assert old > 0, "start() before expand()"
        # [n, old + n]: the proposal rows each new row may see
        allowed = torch.zeros(n, old + n, dtype=torch.bool)
        new_ancestors = []
        for i, r in enumerate(parent_rows):
            assert 0 <= r < old, f"parent row {r} is not a fed row"
            anc = [*self._ancestors[r], r]
            allowed[i, anc] = True
            allowed[i, old + i] = True
            new_ancestors.append(anc)
        pos = [self.hf.past_len + len(a) for a in new_ancestors]
        hidden = self._forward(list(tokens), pos, allowed)
        self._tokens += [int(t) for t in tokens]
        self._ancestors += new_ancestors
        return self._logits(hidden)

    def commit(self, path_rows: Sequence[int]) -> None:
        """Keep the root row and ``path_rows`` (a chain from a child of the root), drop the rest."""
        assert self._tokens, "nothing to commit"
        for i, r in enumerate(path_rows):
            assert self._ancestors[r] == [0, *path_rows[:i]], f"rows {list(path_rows)} are not a path from the root"
        keep = [0, *path_rows]
        commit_cache(self.hf.cache, self.hf.past_len, keep)
        self.hf.past_len += len(keep)
        self.committed += [self._tokens[r] for r in keep]
        self._tokens, self._ancestors = [], []

    def _forward(self, ids: list[int], positions: list[int], allowed: torch.Tensor) -> torch.Tensor:
        """Append rows; ``allowed`` ([n, rows after past_len]) says which uncommitted rows each sees."""
        hf = self.hf
        n = len(ids)
        cols = hf.past_len + allowed.shape[1]
        # [n, past_len + rows]: the committed prefix is always visible
        mask = torch.zeros(n, cols, dtype=hf.dtype)
        mask[:, hf.past_len :].masked_fill_(~allowed, torch.finfo(hf.dtype).min)
        out = hf.decoder(
            input_ids=torch.tensor([ids], dtype=torch.long, device=hf.device),
            attention_mask=mask[None, None].to(hf.device),
            position_ids=torch.tensor([positions], dtype=torch.long, device=hf.device),
            past_key_values=hf.cache,
            use_cache=True,
        )
        # [n, H]
        return out.last_hidden_state[0]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(hidden).float()


@dataclass
class _Proposal:
    """The last proposal's nodes that have draft-cache rows, for ``observe``."""

    # (parent node, token) -> node, over the whole untrimmed pool
    index: dict[tuple[int, int], int]
    # node -> proposal row (only expanded nodes have one; the root is row 0)
    rows: dict[int, int]


class DraftModelDrafter:
    """EAGLE-2-style tree drafting with a separate draft model (source ``draft``).

    ``model`` is a loaded Hugging Face causal LM (or an :class:`HFTarget` / :class:`DraftLM`
    around one) whose vocabulary is the target's; ``target_vocab`` checks that.
    """

    name: ClassVar[str] = "draft"
    needs_hidden: ClassVar[bool] = False

    def __init__(
        self,
        model: nn.Module | HFTarget | DraftLanguageModel,
        config: DraftTreeConfig = DraftTreeConfig(),
        target_vocab: int | None = None,
    ):
        self.lm: DraftLanguageModel = DraftLM(model) if isinstance(model, (nn.Module, HFTarget)) else model
        check_vocab(target_vocab, self.lm.vocab_size)
        self.config = config
        self.generator = torch.Generator(device="cpu")
        self._proposal: _Proposal | None = None
        # [V] draft distribution of each node of the last pool (sampling mode), shared by siblings
        self._q_rows: list[torch.Tensor] = []
        # wall time of each draft forward of the last proposal (calibration reads it)
        self.forward_s: list[float] = []

    def prefill_topk_k(self) -> int:
        return 0

    def begin(self, prompt: Sequence[int], prefill_topk: torch.Tensor | None) -> None:
        self.generator = torch.Generator(device=getattr(self.lm, "device", "cpu"))
        self.generator.manual_seed(self.config.seed)
        self._proposal = None
        self.lm.begin(prompt)

    def propose(self, context: Sequence[int], budget: int) -> ModelDraft:
        """The ``budget`` best nodes of :meth:`draft_pool` (see :func:`trim`), with their
        ``draft_probs`` rows in sampling mode."""
        if budget <= 0:
            return ModelDraft(source=self.name, tokens=[], parents=[])
        kept = trim(self.draft_pool(context), budget)
        if self.config.sample and len(kept):
            # sampled drafts are trimmed to a prefix, so kept node i is pool node i
            kept.draft_probs = torch.stack(self._q_rows[: len(kept)])
        return kept

    def draft_pool(self, context: Sequence[int]) -> ModelDraft:
        """Every drafted node, layer after layer, before trimming to a budget (no ``draft_probs``:
        :meth:`propose` attaches them to the nodes it keeps)."""
        cfg = self.config
        self.forward_s = []
        self._q_rows = []
        depth = min(cfg.depth, self.lm.room(context) - 1)
        if depth < 1:
            self.lm.discard()
            self._proposal = None
            return ModelDraft(source=self.name, tokens=[], parents=[])
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        index: dict[tuple[int, int], int] = {}
        rows: dict[int, int] = {-1: 0}
        confidences: list[float] = []
        layer_sizes: list[int] = []
        stage = None
        checkpoint_of = {d: j for j, d in enumerate(cfg.checkpoints)}

        t0 = time.perf_counter()
        # [1, V]
        log_q = self._log_probs(self.lm.start(context)[None])
        self.forward_s.append(time.perf_counter() - t0)
        # nodes whose distributions are the rows of log_q (the root first), their path scores
        frontier = [-1]
        frontier_scores = [0.0]
        for layer in range(1, depth + 1):
            layer_start = len(tokens)
            kids, kid_log_q, q = self._children(log_q)
            for i, node in enumerate(frontier):
                for tok, lq in zip(kids[i], kid_log_q[i], strict=True):
                    index[(node, tok)] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                    scores.append(frontier_scores[i] + lq)
                    if q is not None:
                        self._q_rows.append(q[i])
            layer_sizes.append(len(tokens) - layer_start)
            j = checkpoint_of.get(layer - 1)
            if j is not None:
                # c_d from the distributions, not from the children drawn (see module docstring)
                best = max(s + m for s, m in zip(frontier_scores, log_q.max(dim=-1).values.tolist(), strict=True))
                confidences.append(math.exp(best))
                if cfg.thresholds is not None and confidences[-1] <= cfg.thresholds[j]:
                    stage = j
                    break
            if layer == depth or len(tokens) == layer_start:
                break
            # EAGLE-2: expand the top_k nodes of the layer by path score, best first
            chosen = heapq.nsmallest(cfg.top_k, range(layer_start, len(tokens)), key=lambda n: (-scores[n], n))
            first_row = len(rows)
            t0 = time.perf_counter()
            logits = self.lm.expand([tokens[n] for n in chosen], [rows[parents[n]] for n in chosen])
            self.forward_s.append(time.perf_counter() - t0)
            for r, n in enumerate(chosen):
                rows[n] = first_row + r
            log_q = self._log_probs(logits)
            frontier = chosen
            frontier_scores = [scores[n] for n in chosen]
        self._proposal = _Proposal(index=index, rows=rows)
        return ModelDraft(
            source=self.name,
            tokens=tokens,
            parents=parents,
            scores=None if cfg.sample else scores,
            stage=stage,
            confidences=confidences,
            layer_sizes=layer_sizes,
            checkpoints=cfg.checkpoints,
        )

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float() / self.config.temperature, dim=-1)

    def _children(self, log_q: torch.Tensor) -> tuple[list[list[int]], list[list[float]], torch.Tensor | None]:
        """Children of each row of ``log_q`` ([m, V]): tokens, their log-probabilities, and
        (sampling mode) the distributions ``q`` ([m, V]) they were drawn from.

        Deterministic: the ``top_k`` most likely tokens. Sampling: the distinct values of
        ``top_k`` i.i.d. draws, in order of first appearance.
        """
        k = min(self.config.top_k, log_q.shape[-1])
        if not self.config.sample:
            top = torch.topk(log_q, k, dim=-1)
            return top.indices.tolist(), top.values.tolist(), None
        # [m, V]: the rows the draws come from are the rows the verifier gets
        q = log_q.exp()
        draws = torch.multinomial(q, k, replacement=True, generator=self.generator).tolist()
        kids = [list(dict.fromkeys(row)) for row in draws]
        return kids, [log_q[i, row].tolist() for i, row in enumerate(kids)], q

    def observe(self, step: StepResult) -> None:
        """Commit the root and the accepted nodes this drafter had fed to its cache.

        Accepted tokens the draft never fed (retrieved nodes, leaves) are fed with the next root.
        """
        proposal, self._proposal = self._proposal, None
        if proposal is None:
            return
        path_rows: list[int] = []
        node = -1
        for i in step.verify.accepted:
            child = proposal.index.get((node, step.tree.tokens[i]))
            if child is None or child not in proposal.rows:
                break
            path_rows.append(proposal.rows[child])
            node = child
        self.lm.commit(path_rows)
