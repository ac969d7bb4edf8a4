"""specgraft's drafters as vLLM ``custom_class`` proposers: per-request state kept across vLLM's
steps, each step's tree cut to the one chain vLLM verifies (the package's docstring)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from specgraft.config import GenerationConfig
from specgraft.drafters.adapld import AdaPLDConfig, AdaPLDDrafter
from specgraft.drafters.pld import PLDConfig, PLDDrafter
from specgraft.drafters.reader_retrieval import ReaderConfig, ReaderRetrieval
from specgraft.integrations.vllm.chains import ChainCost, costed_chain
from specgraft.integrations.vllm.env import DATASTORE_ENV, require_vllm
from specgraft.retrieval import load_datastores
from specgraft.types import DraftTree, PrefillOutput, StepResult, VerifyResult


logger = logging.getLogger(__name__)


@dataclass
class _Request:
    """What is kept for one request between two ``propose`` calls."""

    state: Any
    """The specgraft drafter's per-sequence state."""
    # [n] committed tokens when last seen (how the request is recognised in the next step)
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    proposed: list[int] = field(default_factory=list)
    """The chain proposed last step."""

    @property
    def key(self) -> tuple[int, int]:
        return len(self.tokens), int(self.tokens[-1]) if len(self.tokens) else -1


def _step(tokens: np.ndarray, sampled: Sequence[int]):
    """The :class:`~specgraft.types.StepResult` a specgraft drafter learns from, for a step in which
    vLLM accepted ``sampled[:-1]`` of our chain and emitted ``sampled[-1]``. Drafters read its
    ``new_tokens`` (accepted + bonus) and ``context``; the target's logits are not known here."""
    import torch

    accepted = [int(t) for t in sampled[:-1]]
    tree = DraftTree(tokens=accepted, parents=list(range(-1, len(accepted) - 1)), sources=["vllm"] * len(accepted))
    root = int(tokens[len(tokens) - len(sampled) - 1])
    return StepResult(
        root_token=root, tree=tree, verify=VerifyResult(list(range(len(accepted))), int(sampled[-1])),
        logits=torch.empty(0), context=tokens,  # type: ignore[arg-type]  # read-only array, as the engine's list
    )


class SpecgraftProposer:
    """A specgraft drafter behind vLLM's ``custom_class`` interface; subclasses say which drafter.

    ``check_vllm=False`` skips the vLLM version check (tests, which feed ``propose`` themselves).
    ``cost``: what a draft chain costs vLLM (:class:`ChainCost`; default
    :meth:`ChainCost.for_device` of the served device), used by proposers whose drafts carry
    estimated acceptances.
    """

    name: ClassVar[str] = ""

    def __init__(self, vllm_config: Any, *, check_vllm: bool = True, cost: ChainCost | None = None):
        if check_vllm:
            require_vllm()
        if cost is None:
            cost = ChainCost.for_device(getattr(getattr(vllm_config, "device_config", None), "device_type", None))
        self.cost = cost
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        self._requests: list[_Request] = []
        # drafts proposed / draft tokens proposed / accepted, over the proposer's life
        self.proposed_drafts = 0
        self.proposed_tokens = 0
        self.accepted_tokens = 0

    # -- what a subclass provides ----------------------------------------------------------

    def begin(self, tokens: np.ndarray) -> Any:
        """A new request's drafter state over its committed ``tokens``."""
        raise NotImplementedError

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        """A chain of at most ``k`` tokens to follow ``tokens``."""
        raise NotImplementedError

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        """vLLM accepted ``sampled[:-1]`` of the last chain, then emitted ``sampled[-1]``."""
        raise NotImplementedError

    # -- vLLM's interface ------------------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM hands over the target model; token-level drafters do not use it."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One chain per row of vLLM's input batch (``[]``: no draft for that row this step).

        Example: one request, just prefilled (vLLM sampled its first token, ``2``), whose context
        ``[1, 2, 3, 9, 1, 2]`` repeats ``1 2``; PLD copies what followed it, as far as the
        estimated acceptance stays >= 0.1 (0.3, 0.18, 0.108, then 0.065):

        >>> from types import SimpleNamespace as C
        >>> config = C(speculative_config=C(num_speculative_tokens=5), model_config=C(max_model_len=32))
        >>> proposer = PLDProposer(config, check_vllm=False)
        >>> rows = np.zeros((1, 32), np.int32); rows[0, :6] = [1, 2, 3, 9, 1, 2]
        >>> proposer.propose([[2]], np.array([6]), rows)
        [[3, 9, 1]]
        """
        waiting: dict[tuple[int, int], list[_Request]] = {}
        for r in self._requests:
            waiting.setdefault(r.key, []).append(r)
        live: list[_Request] = []
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            # [n] this row's committed tokens (a view into vLLM's buffer: copied before keeping)
            tokens = token_ids_cpu[i, :n]
            request = self._claim(waiting, tokens, n - len(sampled))
            if not sampled:
                # a prefill chunk or a discarded sample: nothing new, no draft this step
                if request is not None:
                    live.append(request)
                drafts.append([])
                continue
            accepted = len(sampled) - 1
            if request is not None and [int(t) for t in sampled[:-1]] == request.proposed[:accepted]:
                self.accepted_tokens += accepted
                self.observe(request.state, tokens, sampled)
            else:
                # first step of a request (or one whose state is not ours to continue): from its tokens
                request = _Request(self.begin(tokens))
            room = self.max_model_len - n - 1  # draft tokens + vLLM's bonus token must fit
            chain = self.draft(request.state, tokens, min(self.num_speculative_tokens, room)) if room > 0 else []
            request.tokens = np.array(tokens, dtype=np.int64)
            request.proposed = chain
            self.proposed_drafts += bool(chain)
            self.proposed_tokens += len(chain)
            live.append(request)
            drafts.append(chain)
        # state no row claimed: its request left the batch (finished, aborted, preempted)
        self._requests = live
        return drafts

    @staticmethod
    def _claim(waiting: dict[tuple[int, int], list[_Request]], tokens: np.ndarray, before: int) -> _Request | None:
        """The kept request whose tokens are exactly ``tokens[:before]`` (removed from ``waiting``)."""
        if before <= 0:
            return None
        candidates = waiting.get((before, int(tokens[before - 1])), [])
        for j, r in enumerate(candidates):
            if np.array_equal(r.tokens, tokens[:before]):
                return candidates.pop(j)
        return None

    @property
    def num_requests(self) -> int:
        """Requests whose state is kept (those in vLLM's batch at the last step)."""
        return len(self._requests)


class PLDProposer(SpecgraftProposer):
    """specgraft's tree PLD, its best chain (``drafters/pld.py``); copy rates learned per request."""

    name: ClassVar[str] = "pld"

    def __init__(self, vllm_config: Any, *, check_vllm: bool = True, config: Any = None, cost: ChainCost | None = None):
        super().__init__(vllm_config, check_vllm=check_vllm, cost=cost)
        self.drafter = PLDDrafter(config if config is not None else self.default_config(self.cost))
        logger.info(
            "specgraft PLD proposer: %s, %s, num_speculative_tokens=%d", self.drafter.config, self.cost, self.num_speculative_tokens
        )

    @staticmethod
    def default_config(cost: ChainCost, **overrides: Any) -> Any:
        """The PLD configuration the proposer uses under ``cost``: a node can pay for its verify
        token only when its estimated acceptance exceeds the cheapest one more token adds
        (``min_prob``); :meth:`ChainCost.choose` then prices whole chains."""
        if cost.cheapest_token > 0:
            overrides.setdefault("min_prob", cost.cheapest_token)
        return PLDConfig(**overrides)

    def begin(self, tokens: np.ndarray) -> Any:
        return self.drafter.begin(tokens, PrefillOutput(), GenerationConfig())

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        cfg = self.drafter.config
        # every node worth proposing (p >= min_prob): the chain is chosen from the whole tree
        tree = self.drafter.propose(state, tokens, budget=cfg.max_matches * cfg.max_copy)
        return costed_chain(tree, k, self.cost)

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        self.drafter.observe(state, _step(tokens, sampled))


class ReaderProposer(SpecgraftProposer):
    """READER's retrieval path: a trie per request + the shared datastores of ``SPECGRAFT_VLLM_DATASTORE``.

    ``datastores`` (directories) and ``tokenizer`` (for the datastores' vocabulary check) are for
    callers that build the proposer themselves; vLLM builds it from the environment variable and
    the served model's tokenizer.
    """

    name: ClassVar[str] = "reader"

    def __init__(
        self, vllm_config: Any, *, check_vllm: bool = True, datastores: Sequence[str] | None = None, tokenizer: Any = None,
    ):
        super().__init__(vllm_config, check_vllm=check_vllm)
        paths = list(datastores) if datastores is not None else datastore_paths()
        loaded = []
        if paths:
            if tokenizer is None:
                tokenizer = _served_tokenizer(vllm_config)
            loaded = load_datastores(paths, tokenizer)
        # the widening path alone, as deep as vLLM verifies
        config = ReaderConfig(d_search=self.num_speculative_tokens, d_deep=0, draft_nodes=0)
        self.drafter = ReaderRetrieval(config, loaded)
        logger.info(
            "specgraft READER retrieval proposer: %s, datastores: %s", config, ", ".join(paths) or f"none (${DATASTORE_ENV} unset: trie only)"
        )

    def begin(self, tokens: np.ndarray) -> Any:
        return self.drafter.begin(tokens.tolist(), PrefillOutput(), GenerationConfig())

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        return self.drafter.propose(state, tokens, budget=k).tokens[:k]

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        self.drafter.observe(state, _step(tokens, sampled))


class AdaPLDProposer(SpecgraftProposer):
    """AdaPLD's lexical part (``AdaPLDConfig.lexical_only``): the main copy after the most recent
    earlier occurrence of the last token, with learned copy rates."""

    name: ClassVar[str] = "adapld"

    def __init__(self, vllm_config: Any, *, check_vllm: bool = True, cost: ChainCost | None = None):
        super().__init__(vllm_config, check_vllm=check_vllm, cost=cost)
        config = AdaPLDConfig(fallback=False, rerank=False, branches=False, successors=False)
        self.drafter = AdaPLDDrafter(None, layer=1, config=config)
        logger.info("specgraft AdaPLD (lexical) proposer: %s", config)

    def begin(self, tokens: np.ndarray) -> Any:
        return self.drafter.begin(tokens, PrefillOutput(), GenerationConfig())

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        tree = self.drafter.propose(state, tokens, budget=self.drafter.config.max_copy)
        return costed_chain(tree, k, self.cost)

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        self.drafter.observe(state, _step(tokens, sampled))


def datastore_paths() -> list[str]:
    """The directories in ``$SPECGRAFT_VLLM_DATASTORE`` (``:`` or ``,`` separated).

    >>> os.environ[DATASTORE_ENV] = "/a:/b,/c"; datastore_paths(); del os.environ[DATASTORE_ENV]
    ['/a', '/b', '/c']
    """
    raw = os.environ.get(DATASTORE_ENV, "")
    return [p for part in raw.split(",") for p in part.split(os.pathsep) if p.strip()]


def _served_tokenizer(vllm_config: Any) -> Any:
    """The served model's tokenizer (the datastores' vocabulary must be its)."""
    from transformers import AutoTokenizer

    mc = vllm_config.model_config
    return AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=bool(getattr(mc, "trust_remote_code", False)))
