"""AdaPLD's knobs (:class:`AdaPLDConfig`) and the reranking layer it defaults to (:func:`default_layer`)."""

from __future__ import annotations

from dataclasses import dataclass

from specgraft.config import check_step_costs



#: Reranking layer per model signature ``(model_type, num_layers, hidden_size)``, from the
#: sweep in ``benchmarks/experiments/adapld-reader/adapld_layer_sweep.py`` (PLD+'s protocol, AdaPLD Table 6).
#: Qwen2.5-Coder-1.5B (28 layers): 40 held-out texts, 1264 positions with two or more anchors;
#: mean accepted copy 0.595 with the most recent anchor, 0.92-1.00 reranked at any layer, best
#: at layer 21 (0.998; layer 9 = 28 // 3: 0.936), oracle 1.347.
RERANK_LAYERS: dict[tuple[str, int, int], int] = {("qwen2", 28, 1536): 21}

MAIN, BRANCH, SUCCESSOR = 0, 1, 2
KINDS = ("main", "branch", "successor")


def default_layer(model_type: str, num_layers: int, hidden_size: int) -> int:
    """The reranking layer for a model: the swept one, else a third of the depth (at least 1).

    >>> default_layer("llama", 2, 64)
    1
    """
    return RERANK_LAYERS.get((model_type, num_layers, hidden_size), max(1, min(num_layers - 1, num_layers // 3)))


@dataclass(frozen=True)
class AdaPLDConfig:
    max_copy: int = 30
    """Longest main copy (the paper's L = 30)."""
    branch_k: int = 8
    """Branch tokens from the anchor's next-token distribution (the paper's k = 8)."""
    threshold: float = 0.5
    """Cosine of input embeddings above which the semantic fallback takes a position (tau)."""
    layer: int | None = None
    """Hidden-state layer for reranking; None = ``default_layer`` for the target."""
    fallback: bool = True
    """Semantic fallback when no lexical anchor exists (off: ``adapld-no-fallback``)."""
    rerank: bool = True
    """Hidden-state reranking of anchors (off: the most recent anchor, as PLD)."""
    branches: bool = True
    """Branch tokens (off: ``adapld-no-branches``, which also has no successors)."""
    successors: bool = True
    """One successor per branch (off: ``adapld-no-successor``)."""
    min_prob: float = 0.1
    """Nodes whose estimated acceptance is below this are not proposed (0 = the whole tree)."""
    row_cost: float | None = None
    """Cost of a verified row relative to a one-row step: cut the tree where expected tokens
    per cost peaks, as ``PLDConfig.row_cost``; None = ``min_prob`` and the budget alone."""
    step_costs: tuple[float, ...] | None = None
    """Measured cost of verifying 1, 2, ... rows, replacing ``row_cost``'s line (``PLDConfig.step_costs``)."""
    lazy: bool = True
    """Look up a successor only when it can pass ``min_prob`` (else only if its branch turns out
    right, in ``observe``, to learn from it); False builds every successor and cuts after (the
    plain twin: the same trees and rates, ``tests/unit/drafters/test_adapld.py``)."""
    anchor_logits: str = "draft"
    """How a prompt anchor's next-token distribution (its branch tokens) is computed from its
    final hidden state: ``"draft"`` through the target's drafting head (``HFTarget.draft_head``:
    an int8 copy of the output embedding on a CPU, ~6 ms a row against ~21 ms), ``"exact"``
    through the target's own head (the plain twin). Branches only; verification is exact."""
    prompt_logits: str = "auto"
    """When a prompt anchor's next-token distribution is computed: ``"on-demand"``, the first
    time the position is an anchor whose branches can pass the cut (one row through the drafting
    head); ``"at-once"``, every prompt position's top-k when the prompt's rows arrive (chunks
    through the head, one copy to the host), read at first use, so the trees are on-demand's;
    ``"auto"``: at once when those rows are on a GPU, where one row's head and top-k cost what
    hundreds do (launch-bound), on demand on a CPU, where a 1,500-token prompt's logits cost ~3 s
    on two cores."""
    prior_first: tuple[float, ...] = (0.3, 0.5, 0.8)
    """Prior rate of the main copy's first token, by agreement n = 1, 2, >=3 before the anchor."""
    prior_later: tuple[float, ...] = (0.5, 0.7, 0.88)
    """Prior rate of a later main-copy token given its parent was right, by n."""
    prior_branch: float = 0.57
    """Prior ``c``: a branch is right ``c`` times as often as the anchor's distribution says.
    Measured with Qwen2.5-Coder-1.5B over 11 held-out prompts of the input-guided tasks, math and
    qa (408 steps, every branch of every step): 103 of 3,264 branches right against a summed
    anchor probability of 181, c = 0.57 (the anchor's context is not the query's)."""
    prior_successor: float = 0.3
    """Prior rate of a successor given its branch was right (measured as ``prior_branch``: 10 of
    32). The main copy's priors below measured within 0.07 of themselves there (e.g. a first
    token after n = 1: 61 of 237; later tokens after n >= 3: 271 of 297)."""
    prior_strength: float = 8.0
    """Pseudo-observations behind each prior."""

    def __post_init__(self) -> None:
        if self.max_copy < 1 or self.branch_k < 0:
            raise ValueError(f"max_copy must be >= 1 and branch_k >= 0, got {self.max_copy}, {self.branch_k}")
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold is a cosine in [-1, 1], got {self.threshold}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must lie in [0, 1), got {self.min_prob}")
        if self.row_cost is not None and not self.row_cost >= 0.0:
            raise ValueError(f"row_cost must be >= 0, got {self.row_cost}")
        check_step_costs(self.step_costs)
        if self.layer is not None and self.layer < 1:
            raise ValueError(f"layer must be >= 1 (a decoder layer's output), got {self.layer}")
        if self.anchor_logits not in ("draft", "exact"):
            raise ValueError(f"anchor_logits is 'draft' or 'exact', got {self.anchor_logits!r}")
        if self.prompt_logits not in ("auto", "on-demand", "at-once"):
            raise ValueError(f"prompt_logits is 'auto', 'on-demand' or 'at-once', got {self.prompt_logits!r}")
        if len(self.prior_first) != len(self.prior_later) or not self.prior_first:
            raise ValueError("prior_first and prior_later need the same, non-zero length")

    @property
    def lexical_only(self) -> bool:
        """No semantic fallback, no reranking, no branches: the most recent lexical anchor's main
        copy, which needs nothing of the target but token ids (the vLLM proposer,
        ``specgraft/integrations/vllm.py``).

        >>> AdaPLDConfig(fallback=False, rerank=False, branches=False).lexical_only
        True
        """
        return not (self.fallback or self.rerank or self.branches)


