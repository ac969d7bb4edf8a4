"""The AdaPLD drafter: anchors, copies, branches and successors as a tree (the package's docstring)."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from specgraft.config import GenerationConfig
from specgraft.drafters.base import Learning, StatelessDrafter
from specgraft.drafters.pld import CopyRates, prune
from specgraft.types import Draft, PrefillOutput, PrefillRequest, StepResult
from specgraft.drafters.adapld.config import AdaPLDConfig, default_layer
from specgraft.drafters.adapld.state import AdaPLDState, Proposal, SeenTokens, packed_top, rows_to_host, unit_rows

#: Reranking layer per model signature ``(model_type, num_layers, hidden_size)``, from the
#: sweep in ``benchmarks/experiments/adapld-reader/adapld_layer_sweep.py`` (PLD+'s protocol, AdaPLD Table 6).
#: Qwen2.5-Coder-1.5B (28 layers): 40 held-out texts, 1264 positions with two or more anchors;
#: mean accepted copy 0.595 with the most recent anchor, 0.92-1.00 reranked at any layer, best
#: at layer 21 (0.998; layer 9 = 28 // 3: 0.936), oracle 1.347.
RERANK_LAYERS: dict[tuple[str, int, int], int] = {("qwen2", 28, 1536): 21}

MAIN, BRANCH, SUCCESSOR = 0, 1, 2
class AdaPLDDrafter(StatelessDrafter):
    """AdaPLD over the target's own hidden states and input embeddings (source ``adapld``).

    ``embeddings`` is the target's ``[V, H]`` input embedding matrix (the semantic fallback);
    ``layer`` the decoder layer whose hidden states rerank anchors (``HFTarget`` returns them
    for the prompt at prefill and for every verified row). A ``config.lexical_only`` drafter
    needs neither (``embeddings=None``): it reads token ids alone and asks the target for nothing.
    """

    name: ClassVar[str] = "adapld"
    needs_hidden: ClassVar[bool] = True
    # a fused start (``SpecEngine.start``) may deliver the prompt's hidden states with the first
    # step: the first tree then anchors at the most recent lexical match (nothing to rerank with
    # yet) and has no branches, as any step whose anchor has no hidden state
    deferred_prefill: ClassVar[bool] = True

    def __init__(
        self,
        embeddings: torch.Tensor | None,
        layer: int,
        config: AdaPLDConfig = AdaPLDConfig(),
        learning: Learning = Learning.REQUEST,
        logits_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.config = config
        # final hidden states [n, H] -> logits [n, V]: the target's drafting head or its own (anchor_logits)
        self.logits_of = logits_of
        self.hidden_layer = layer
        if embeddings is None and not config.lexical_only:
            raise ValueError("AdaPLD's semantic fallback, reranking and branches need the target's input embeddings")
        # [V, H], or None (lexical only)
        self.embeddings = embeddings.detach() if embeddings is not None else None
        self.learning = Learning(learning)
        c = config
        self.rates = CopyRates(c.prior_first, c.prior_later, c.prior_strength)
        self.branch_rate = CopyRates((c.prior_branch,), (c.prior_branch,), c.prior_strength)
        self.successor_rate = CopyRates((c.prior_successor,), (c.prior_successor,), c.prior_strength)
        # token id -> unit input embedding (a model constant: shared, read-only after first use)
        self._unit_embedding: dict[int, np.ndarray] = {}

    @property
    def top_k(self) -> int:
        return max(self.config.branch_k + 1, 1)

    def prefill_request(self) -> PrefillRequest:
        if self.config.lexical_only:
            return PrefillRequest()
        if self.logits_of is not None:
            return PrefillRequest(hidden=True, hidden_layer=self.hidden_layer, final_hidden=self.config.branches)
        return PrefillRequest(topk=self.top_k, hidden=True, topk_probs=True, hidden_layer=self.hidden_layer)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> AdaPLDState:
        shared = self.learning is Learning.SHARED
        state = AdaPLDState(
            tokens=np.asarray(prompt, dtype=np.int64),
            hidden=np.zeros((0, self.embeddings.shape[1] if self.embeddings is not None else 0), dtype=np.float32),
            top_ids=np.zeros((0, self.top_k), dtype=np.int64),
            top_probs=np.zeros((0, self.top_k), dtype=np.float32),
            known=0,
            rates=self.rates if shared else self.rates.copy(),
            branch_rate=self.branch_rate if shared else self.branch_rate.copy(),
            successor_rate=self.successor_rate if shared else self.successor_rate.copy(),
        )
        if len(prompt) > 1 and not self.config.lexical_only and not prefill.deferred:
            self.take_prefill(state, prefill)
        return state

    def take_prefill(self, state: AdaPLDState, prefill: PrefillOutput) -> None:
        """The prompt's rows of the memory (hidden states, and the top-k or the final hidden
        states it is computed from), from the prefill or, on a fused start, the first step; a
        long prompt's come in two parts (its whole prefill chunks at begin, the rest with the
        first step: ``SpecEngine.fused_head``), appended in order."""
        if prefill.hidden is None:
            raise ValueError("AdaPLD needs the prefill's hidden states (prefill_request)")
        n = len(prefill.hidden)
        ids = np.zeros((n, self.top_k), dtype=np.int64)
        probs = np.zeros((n, self.top_k), dtype=np.float32)
        if prefill.final_hidden is not None:
            # the prompt's logits are read on first use (top_of), computed then or now
            if state.prompt_final is not None and len(state.prompt_final) != state.known:
                raise ValueError(f"AdaPLD got prompt rows after {state.known} rows of its memory, "
                                 f"{len(state.prompt_final)} of them the prompt's: they must follow the prompt's first part")
            first = state.prompt_final is None
            state.prompt_final = prefill.final_hidden if first else torch.cat([state.prompt_final, prefill.final_hidden])
            if first:
                state.has_top = np.zeros(n, dtype=bool)
            mode = self.config.prompt_logits
            if self.config.branches and (mode == "at-once" or (mode == "auto" and prefill.final_hidden.device.type != "cpu")):
                top = self.prompt_top(prefill.final_hidden)
                if state.prompt_top is not None:
                    top = (np.concatenate([state.prompt_top[0], top[0]]), np.concatenate([state.prompt_top[1], top[1]]))
                state.prompt_top = top
            state.append_rows(unit_rows(prefill.hidden), ids, probs, filled=False)
            return
        if prefill.topk is not None and prefill.topk_probs is not None:
            k = min(self.top_k, prefill.topk.shape[1])
            ids[:, :k], probs[:, :k] = prefill.topk[:, :k].numpy(), prefill.topk_probs[:, :k].numpy()
        elif self.config.branches:
            raise ValueError("AdaPLD's branches need the prefill's top-k or final hidden states (prefill_request)")
        state.append_rows(unit_rows(prefill.hidden), ids, probs)

    @staticmethod
    def has_top(state: AdaPLDState, a: int) -> bool:
        """Whether the target's top-k after position ``a`` is at hand (a generated position, or a
        prompt position whose logits were computed)."""
        return state.has_top is None or a >= len(state.has_top) or bool(state.has_top[a])

    def prompt_top(self, final: torch.Tensor, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """``[P, k]`` top-k ids and probabilities of every prompt position from its final hidden
        state ``final`` ``[P, H]`` (``prompt_logits="at-once"``): ``chunk`` rows at a time through
        the drafting head, one copy to the host at the end."""
        if self.logits_of is None:
            raise ValueError("AdaPLD's prompt logits need the target's logits_of")
        parts = [packed_top(self.logits_of(final[i : i + chunk]), self.top_k) for i in range(0, len(final), chunk)]
        if not parts:
            return np.zeros((0, self.top_k), np.int64), np.zeros((0, self.top_k), np.float32)
        packed = torch.cat(parts).cpu().numpy()
        return packed[:, : self.top_k].astype(np.int64), np.ascontiguousarray(packed[:, self.top_k :])

    def top_of(self, state: AdaPLDState, a: int) -> tuple[np.ndarray, np.ndarray]:
        """The target's top-k ids and probabilities after position ``a`` (read on first use for a
        prompt position, computed then unless ``prompt_top`` was; kept from the verify pass for
        a generated one)."""
        if state.has_top is not None and a < len(state.has_top) and not state.has_top[a]:
            if state.prompt_top is not None:
                state.top_ids[a], state.top_probs[a] = state.prompt_top[0][a], state.prompt_top[1][a]
            else:
                if self.logits_of is None or state.prompt_final is None:
                    raise ValueError(f"AdaPLD has no logits for prompt position {a}: build it with the target's logits_of")
                ids, probs, _ = rows_to_host(self.logits_of(state.prompt_final[a : a + 1]), None, self.top_k)
                state.top_ids[a], state.top_probs[a] = ids[0], probs[0]
            state.has_top[a] = True
        return state.top_ids[a], state.top_probs[a]

    # -- retrieval ---------------------------------------------------------------------------

    def unit_embeddings(self, tokens: np.ndarray) -> np.ndarray:
        """``[n, H]`` unit input embeddings of ``tokens`` (cached per token id)."""
        missing = [int(t) for t in np.unique(tokens) if int(t) not in self._unit_embedding]
        if missing:
            rows = unit_rows(self.embeddings[torch.as_tensor(missing, device=self.embeddings.device)])
            self._unit_embedding.update(zip(missing, rows, strict=True))
        return np.stack([self._unit_embedding[int(t)] for t in tokens]) if len(tokens) else np.zeros((0, self.embeddings.shape[1]), np.float32)

    def candidates(self, state: AdaPLDState, mem: np.ndarray, query: int, end: int) -> tuple[np.ndarray, bool]:
        """Positions ``j < end`` to anchor ``query`` at, and whether they are lexical (eq. 3-5):
        the earlier positions of ``query`` itself, else (the semantic fallback) those of every
        distinct earlier token whose input embedding has cosine >= ``threshold`` with it. The
        distinct tokens and their embeddings are kept in ``state.seen`` as the memory grows;
        :meth:`candidates_plain` is the twin that recomputes them at every call."""
        lexical = np.flatnonzero(mem[:end] == query)
        if len(lexical) or not self.config.fallback or end == 0:
            return lexical, True
        if state.seen is None:
            state.seen = SeenTokens.empty(self.embeddings.shape[1])
        state.seen.extend(mem, self.unit_embeddings)
        k = state.seen.upto(end)
        sims = state.seen.units[:k] @ self.unit_embeddings(np.array([query]))[0]
        close = state.seen.tokens[:k][sims >= self.config.threshold]
        return np.flatnonzero(np.isin(mem[:end], close)), False

    def candidates_plain(self, mem: np.ndarray, query: int, end: int) -> tuple[np.ndarray, bool]:
        """:meth:`candidates` computed from scratch (the distinct tokens of ``mem[:end]`` and all
        their embeddings at every call): the plain twin the tests compare it with."""
        lexical = np.flatnonzero(mem[:end] == query)
        if len(lexical) or not self.config.fallback or end == 0:
            return lexical, True
        uniq = np.unique(mem[:end])
        sims = self.unit_embeddings(uniq) @ self.unit_embeddings(np.array([query]))[0]
        close = uniq[sims >= self.config.threshold]
        return np.flatnonzero(np.isin(mem[:end], close)), False

    def select(self, state: AdaPLDState, cands: np.ndarray, reference: int) -> int:
        """The candidate whose preceding hidden state is closest to ``hidden[reference]`` (eq. 6-7,
        13-14); ties and ``rerank=False``: the most recent. A candidate at position 0 has no
        preceding state and ranks last."""
        if not self.config.rerank or reference < 0 or reference >= state.known:
            return int(cands[-1])
        prev = cands - 1
        usable = (prev >= 0) & (prev < state.known)
        if not usable.any():
            return int(cands[-1])
        scores = np.full(len(cands), -2.0, dtype=np.float32)
        scores[usable] = state.hidden[prev[usable]] @ state.hidden[reference]
        # the last maximum: most recent on ties
        return int(cands[len(scores) - 1 - int(np.argmax(scores[::-1]))])

    @staticmethod
    def agreement(mem: np.ndarray, a: int, t: int, cap: int = 3) -> int:
        """How many tokens up to the anchor agree with those up to the query (1 .. cap).

        >>> AdaPLDDrafter.agreement(np.array([4, 5, 9, 4, 5]), 1, 4)
        2
        """
        n = 1
        while n < cap and a - n >= 0 and mem[a - n] == mem[t - n]:
            n += 1
        return n

    # -- the tree ----------------------------------------------------------------------------

    def propose(self, state: AdaPLDState, context: Sequence[int], budget: int) -> Draft:
        mem = state.sync(context)
        cfg = self.config
        t = len(mem) - 1  # the root's position
        tokens: list[int] = []
        parents: list[int] = []
        kinds: list[int] = []
        keys: list[tuple[int, int, float]] = []
        probs: list[float] = []
        state.last = None
        cands, lexical = self.candidates(state, mem, int(mem[t]), t)
        if not len(cands):
            state.anchors["none"] += 1
            return Draft(source=self.name, tokens=[], parents=[], scores=[])
        state.anchors["lexical" if lexical else "semantic"] += 1
        a = self.select(state, cands, t - 1)
        main_first = None
        if lexical:
            n = self.agreement(mem, a, t)
            p, parent = 1.0, -1
            for d, tok in enumerate(mem[a + 1 : min(a + cfg.max_copy, t) + 1].tolist(), start=1):
                p *= state.rates.rate(n, d)
                tokens.append(int(tok))
                parents.append(parent)
                kinds.append(MAIN)
                keys.append((n, d, 1.0))
                probs.append(p)
                parent = len(tokens) - 1
            main_first = tokens[0] if tokens else None
        deferred: list[tuple[int, int]] = []  # (branch node, branch token): successor looked up in observe
        if cfg.branches and a < state.known and (state.branch_rate.rate(1, 1) >= cfg.min_prob or self.has_top(state, a)):
            c = state.branch_rate.rate(1, 1)
            s = state.successor_rate.rate(1, 1)
            top_ids, top_probs = self.top_of(state, a)
            branch_ids = [(int(b), float(q)) for b, q in zip(top_ids, top_probs, strict=True) if int(b) != main_first]
            for b, q in branch_ids[: cfg.branch_k]:
                node = len(tokens)
                p_b = min(1.0, c * q)
                tokens.append(b)
                parents.append(-1)
                kinds.append(BRANCH)
                keys.append((1, 1, q))
                probs.append(p_b)
                if not cfg.successors:
                    continue
                if cfg.lazy and p_b * s < cfg.min_prob:
                    deferred.append((node, b))  # below the cut: not proposed, only learned from
                    continue
                succ = self.successor(state, mem, b, a, t)
                if succ is not None:
                    tokens.append(succ)
                    parents.append(node)
                    kinds.append(SUCCESSOR)
                    keys.append((1, 2, 1.0))
                    probs.append(p_b * s)
        # a child never beats its parent (rates <= 1), so dropping p < min_prob keeps a tree
        keep = prune(parents, probs, [i for i in range(len(tokens)) if probs[i] >= cfg.min_prob], budget, cfg.row_cost, cfg.step_costs)
        state.last = Proposal(tokens, parents, kinds, keys, deferred, a, t)
        return Draft(source=self.name, tokens=tokens, parents=parents, scores=probs).subset(keep)

    def successor(self, state: AdaPLDState, mem: np.ndarray, branch: int, anchor: int, t: int) -> int | None:
        """The one successor of branch token ``branch`` (eq. 13-15): the token after the earlier
        position of ``branch`` (lexical first, else the semantic fallback) whose preceding state
        is closest to the anchor's; None when ``branch`` has no earlier position."""
        cands, _ = self.candidates(state, mem, branch, t)  # x_{j+1} must exist: j <= t - 1
        if not len(cands):
            return None
        return int(mem[self.select(state, cands, anchor) + 1])

    # -- learning ----------------------------------------------------------------------------

    def observe(self, state: AdaPLDState, step: StepResult) -> None:
        """Extend the memory with the verified rows' hidden states and top-k; learn the rates."""
        truth = step.new_tokens
        last = state.last
        if last is not None and len(truth) >= 2:
            # successors left out of the tree (below the cut) of branches that were right
            for _, b in last.deferred:
                if b == truth[0]:
                    succ = self.successor(state, state.tokens, b, last.anchor, last.root)
                    if succ is not None:
                        state.successor_rate.record(1, 1, succ == truth[1])
        if not self.config.lexical_only:
            if step.prefill is not None:  # a fused start: the prompt's rows come first
                self.take_prefill(state, step.prefill)
            rows = [0, *(i + 1 for i in step.verify.accepted)]
            if step.hidden is None:
                raise ValueError("AdaPLD needs the verify pass's hidden states (needs_hidden)")
            idx = torch.as_tensor(rows, device=step.logits.device)
            ids, probs, units = rows_to_host(step.logits[idx], step.hidden[idx.to(step.hidden.device)], self.top_k)
            state.append_rows(units, ids, probs)
        state.sync(step.context)
        if last is None:
            return
        tokens, parents, kinds, keys = last.tokens, last.parents, last.kinds, last.keys
        state.last = None
        right = [False] * len(tokens)
        for i, p in enumerate(parents):
            n, d, weight = keys[i]
            if not (p < 0 or right[p]) or d > len(truth):
                continue
            right[i] = hit = tokens[i] == truth[d - 1]
            if kinds[i] == MAIN:
                state.rates.record(n, d, hit)
            elif kinds[i] == BRANCH:
                state.branch_rate.record(1, 1, hit, weight=weight)
            else:
                state.successor_rate.record(1, 1, hit)


def build_adapld(target: Any, config: AdaPLDConfig, learning: Learning = Learning.REQUEST) -> AdaPLDDrafter:
    """An :class:`AdaPLDDrafter` for an :class:`~specgraft.models.hf.HFTarget` (its embeddings and
    layer count; the layer from ``config.layer`` or :func:`default_layer`)."""
    num_layers = int(target.num_layers)
    if num_layers < 2:
        raise ValueError(f"AdaPLD reranks with a hidden layer below the last; {target.name!r} has {num_layers} layer(s)")
    layer = config.layer
    if layer is None:
        cfg = target.config
        layer = default_layer(str(getattr(cfg, "model_type", "")), num_layers, int(getattr(cfg, "hidden_size", 0)))
    if not 1 <= layer < num_layers:
        raise ValueError(f"AdaPLD layer {layer} is not in 1 .. {num_layers - 1} for {target.name!r}")
    head = target.logits_of
    if config.anchor_logits == "draft" and config.branches and hasattr(target, "draft_head"):
        head = target.draft_head()
    return AdaPLDDrafter(target.input_embeddings(), layer, config, learning, logits_of=head)
