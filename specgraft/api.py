"""Text-level API: tokenizer, chat template, stop strings and streaming over :class:`SpecEngine`.

Five lines::

    from specgraft import SpecDecoder
    dec = SpecDecoder.from_pretrained("smollm2-135m-instruct")  # method: pld (no draft model)
    out = dec.generate("Write a haiku about caches.", max_new_tokens=64, chat=True)
    print(out.text, out.stats.mat)
    for piece in dec.stream("Explain KV caches.", chat=None): print(piece, end="")  # None: the template if there is one
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from specgraft.batch import BatchEngine
from specgraft.budget.costs import CostTable, resolve_cost_table
from specgraft.budget.policy import BudgetPolicy
from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.detokenize import TextStream
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, default_method, get_method, method_budget
from specgraft.methods.reader import load_method_datastores
from specgraft.models.backends import gguf_path, resolve_backend, tokenizer_source
from specgraft.models.device import parse_dtype, resolve_device
from specgraft.models.fusion import fused_groups
from specgraft.models.graphs import replays_graphs
from specgraft.models.hf import HFTarget
from specgraft.models.kernels import set_min_rows, small_input_rows
from specgraft.models.llamacpp import LlamaCppTarget, load_draft_gguf
from specgraft.models.loading import load_causal_lm, load_draft_model
from specgraft.models.quant import draft_numerics
from specgraft.models.resolve import load_errors, resolve_model
from specgraft.types import GenerationStats

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass
class GenerationOutput:
    text: str
    # new token ids (EOS included when it ended generation)
    tokens: list[int]
    stats: GenerationStats
    config: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    """``"stop"`` (EOS or a stop string), ``"length"`` (``max_new_tokens`` or the context window),
    ``"cancelled"``."""


def eos_ids(tokenizer: PreTrainedTokenizerBase | None, model: PreTrainedModel | None, target: Any = None) -> list[int]:
    """EOS ids from the generation config (chat models often list several), the tokenizer, and a
    target that knows its own (a GGUF's end-of-generation tokens: ``LlamaCppTarget.eos_token_ids``)."""
    ids: set[int] = set(getattr(target, "eos_token_ids", ()))
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(getattr(model, "config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(t) for t in source)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


class SpecDecoder:
    """A model, its tokenizer and one method; shares the model (and the draft model, if any) with
    siblings from :meth:`with_method`.

    ``method=None`` is :func:`~specgraft.methods.default_method`: ``draft-tree`` when a draft
    model is given (``draft_model`` or ``options.graft.draft_model``), else ``pld``.

    ``draft_model`` is an already loaded draft model for the methods that need one
    (``MethodSpec.needs_draft_model``); without it, ``options.graft.draft_model`` is loaded.
    Their other knobs are ``options.graft`` too, e.g. draft children sampled for rejection
    sampling at temperature 0.7 (``--sample-drafts``)::

        graft = with_sampled_drafts(GraftOptions(draft_model="qwen2.5-coder-0.5b-instruct"), temperature=0.7)
        dec = SpecDecoder.from_pretrained("qwen2.5-coder-1.5b-instruct", method="graft", options=MethodOptions(graft=graft))
        dec.generate("...", temperature=0.7, seed=0)
    """

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase | None,
        method: str | None = None,
        options: MethodOptions = MethodOptions(),
        target: HFTarget | LlamaCppTarget | None = None,
        draft_model: PreTrainedModel | LlamaCppTarget | None = None,
        progress: bool = True,
    ):
        method = method if method is not None else default_method(options, draft_model)
        self.spec = get_method(method)
        if model is None and target is None:
            raise ValueError("SpecDecoder needs a model or a target (e.g. a LlamaCppTarget)")
        self.model = model
        self.tokenizer = tokenizer
        self.method = method
        self.target = target if target is not None else HFTarget(model)
        self.backend = getattr(self.target, "backend", "hf")
        self.spec.check_backend(self.backend)
        if draft_model is None and self.spec.needs_draft_model:
            self.spec.check(options)
            graft = options.graft
            if self.backend == "llamacpp":
                draft_model = load_draft_gguf(graft.draft_model, self.target, progress=progress, quant=graft.draft_quant)
            else:
                draft_model = load_draft_model(graft.draft_model, graft.draft_dtype, self.target.device, progress, tokenizer, graft.draft_quant)
        self.draft_model = draft_model
        if options.datastores and tokenizer is not None and self.spec.reads_datastores:
            # refuses a datastore built with another tokenizer (the build only sees the vocabulary size)
            load_method_datastores(options.datastores, self.target.vocab_size, tokenizer)
        if options.cost_table == "auto":
            options = dataclasses.replace(options, cost_table=resolve_cost_table("auto", self.target.name, self.target.cost_device, self.target.threads))
        if self.target.dear_rows and options.row_cost is None and options.step_costs is None and options.cost_table:
            # the measured curve, not a line: llama.cpp's 4 rows cost what 2 do, 2 rows 1.4 of one
            options = dataclasses.replace(options, step_costs=CostTable.load(options.cost_table).step_costs(1))
        self.options = options
        self.small_input_rows: int | None = None  # None: the model's linears were left as they were
        if options.cost_table and self.target.device.type == "cpu" and model is not None:
            # pad 1-3 row inputs where the table says a few rows cost less than one (models/kernels.py)
            self.small_input_rows = small_input_rows(CostTable.load(options.cost_table))
            set_min_rows(model, self.small_input_rows)
        # derived from the device's cost table where one exists (budget/defaults.py); else
        # the fixed defaults: draft-model methods their preset's budget, READER its tree shape's
        self.default_budget = method_budget(method, options)
        drafters, composer = self.spec.build(self.target, options, draft_model)
        self.engine = SpecEngine(
            self.target, drafters, composer, method=method, eos_token_ids=eos_ids(tokenizer, model, self.target),
            default_budget=self.default_budget,
        )
        self.last_output: GenerationOutput | None = None

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        method: str | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        options: MethodOptions = MethodOptions(),
        cache_dir: str | None = None,
        progress: bool = True,
        fast_kernels: bool = True,
        backend: str = "auto",
        threads: int | None = None,
        strict: bool = False,
    ) -> "SpecDecoder":
        """Load by catalog name (pulled on first use), local directory, Hugging Face id or
        ``.gguf`` file.

        ``backend`` (:mod:`specgraft.models.backends`): ``hf`` (transformers on torch), ``llamacpp``
        (the GGUF through llama.cpp: a ``.gguf`` file or a catalog name's GGUF; the draft model of
        draft-model methods too; ``threads`` and ``strict`` go to :class:`LlamaCppTarget`), or
        ``auto``: ``llamacpp`` for a ``.gguf`` file, else ``hf``.

        A model that cannot be pulled or loaded raises :class:`~specgraft.models.resolve.ModelLoadError`
        (an ``OSError``) naming it.

        ``device="auto"`` is ``cuda`` when a GPU is available, else ``cpu``; ``dtype="auto"`` picks
        float32 on CPUs (exact: every method equals plain decoding token for token) and
        bfloat16 on GPUs (see ``models/kernels.py``);
        ``fast_kernels`` fuses the q/k/v and gate/up projections (``models/fusion.py``) and swaps
        the linears for oneDNN ones on CPU (same numbers, faster). A method
        that needs a draft model loads ``options.graft.draft_model`` the same way, on the same device.
        ``method=None``: ``draft-tree`` with ``options.graft.draft_model``, else ``pld``
        (:func:`~specgraft.methods.default_method`).
        """
        method = method if method is not None else default_method(options)
        backend = resolve_backend(backend, name_or_path)
        # fail on a bad method, device, a missing draft model or calibration before loading anything
        get_method(method).check(options)
        get_method(method).check_backend(backend)
        if backend == "llamacpp":
            if dtype not in ("auto", None):
                raise ValueError(f"the llama.cpp backend computes in the GGUF's own quantization; --dtype {dtype} does not apply to it")
            return cls._from_gguf(name_or_path, method, options, cache_dir, progress, threads, strict)
        if strict:
            raise ValueError("strict mode is the llama.cpp backend's (the hf backend in float32 is exact as it is)")
        device = resolve_device(device)
        parse_dtype(dtype, device)
        path = resolve_model(name_or_path, cache_dir=cache_dir, progress=progress)
        with load_errors(name_or_path):
            AutoConfig.from_pretrained(path)  # cheap: says "not a model" before the tokenizer says something vaguer
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = load_causal_lm(path, dtype, device, fast_kernels)
        return cls(model, tokenizer, method, options, progress=progress)

    @classmethod
    def _from_gguf(
        cls, name_or_path: str, method: str, options: MethodOptions, cache_dir: str | None, progress: bool, threads: int | None, strict: bool
    ) -> "SpecDecoder":
        """:meth:`from_pretrained` on the llama.cpp backend: the target's GGUF (and the draft
        model's, same threads, never strict: a draft's numbers never reach the output), the
        Hugging Face tokenizer beside it (or read out of the GGUF)."""
        path = gguf_path(name_or_path, cache_dir=cache_dir, progress=progress)
        with load_errors(name_or_path):
            directory, gguf_file = tokenizer_source(path)
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file) if gguf_file else AutoTokenizer.from_pretrained(directory)
        target = LlamaCppTarget(path, threads=threads, strict=strict, name=str(name_or_path))
        draft = None
        if get_method(method).needs_draft_model:
            draft = load_draft_gguf(options.graft.draft_model, target, cache_dir=cache_dir, progress=progress, quant=options.graft.draft_quant)
        return cls(None, tokenizer, method, options, target=target, draft_model=draft, progress=progress)

    def with_method(
        self, method: str, options: MethodOptions | None = None, draft_model: PreTrainedModel | LlamaCppTarget | None = None
    ) -> "SpecDecoder":
        """Another method over the same loaded model, adapter (each generation has its own cache
        slot), tokenizer and draft model (``draft_model`` replaces the latter)."""
        draft_model = draft_model if draft_model is not None else self.draft_model
        return SpecDecoder(self.model, self.tokenizer, method, options or self.options, target=self.target, draft_model=draft_model)

    # -- prompts -------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template (instruct models do)."""
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def uses_chat(self, chat: bool | None) -> bool:
        """Whether a text prompt goes through the chat template: ``chat``, or for ``None`` whether
        the tokenizer has one (``has_chat_template``)."""
        return self.has_chat_template if chat is None else chat

    def encode(self, prompt: str | Sequence[int], chat: bool | None = False) -> list[int]:
        """Token ids of ``prompt`` (a string, or ids passed through), with the chat template if
        asked (``chat=None``: if the tokenizer has one)."""
        if not isinstance(prompt, str):
            ids = [int(t) for t in prompt]
        else:
            if not prompt:
                raise ValueError("the prompt is empty")
            if self.tokenizer is None:
                raise ValueError("this decoder has no tokenizer; pass token ids")
            if self.uses_chat(chat):
                return self.encode_messages([{"role": "user", "content": prompt}])
            ids = self.tokenizer(prompt)["input_ids"]
        if not ids:
            raise ValueError("the prompt is empty")
        return list(ids)

    def encode_messages(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (``[{"role": ..., "content": ...}, ...]``) through the chat
        template, ending where the assistant's reply starts."""
        if not messages:
            raise ValueError("the message list is empty")
        if self.tokenizer is None:
            raise ValueError("this decoder has no tokenizer; pass token ids")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template; drop chat=True")
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("the prompt is empty")
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True) if self.tokenizer is not None else ""

    @staticmethod
    def make_config(
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        budget: int | None = None,
        stop: Sequence[str] = (),
        stop_on_eos: bool = True,
    ) -> GenerationConfig:
        """``budget=None``: the method's default budget, filled in when a decoder runs the config
        (:meth:`resolve`). ``stop_on_eos=False`` generates ``max_new_tokens`` tokens, EOS or not."""
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            budget=budget,
            stop_strings=tuple(stop),
            stop_on_eos=stop_on_eos,
            sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        )

    # -- generation ------------------------------------------------------------------------

    def stream(self, prompt: str | Sequence[int], chat: bool | None = False, config: GenerationConfig | None = None, **kw) -> Iterator[str]:
        """Yield text pieces as they are accepted; ``self.last_output`` holds the result afterwards.
        ``chat``: apply the chat template to a text prompt (``None``: if the tokenizer has one).

        Keyword arguments are those of :meth:`make_config` (``max_new_tokens``, ``temperature``...).
        Text is detokenised incrementally (:mod:`specgraft.detokenize`: each token's text costs a
        short window, not the whole output), and text that might be the start of a stop string
        is held back until it is decided. With stop strings, the output ends before the first
        one, and the tokens after the one that completed it are dropped.
        """
        config = self.resolve(config or self.make_config(**kw))
        ids = self.encode(prompt, chat)
        text = TextStream(self.tokenizer, config.stop_strings)
        seq = self.engine.start(ids, config)
        try:
            while not seq.done and not text.stopped:
                piece = text.push(self.engine.step(seq))
                if piece:
                    yield piece
            piece = text.close()
            if piece:
                yield piece
        finally:
            self.engine.finish(seq)
            self.last_output = self._output(text, seq.stats, config, seq.finish_reason)

    def _output(self, text: TextStream, stats: GenerationStats, config: GenerationConfig, reason: str | None) -> GenerationOutput:
        """A finished request's output; tokens dropped after a stop string leave the stats."""
        stats.trim_last_step(text.dropped)
        reason = "stop" if text.stopped else reason
        return GenerationOutput(text=text.text, tokens=text.tokens, stats=stats, config=self.resolved_config(config), finish_reason=reason)

    # -- batches ---------------------------------------------------------------------------

    def batch_engine(self, max_batch: int = 8, policy: BudgetPolicy | None = None, max_queue: int | None = None) -> BatchEngine:
        """A :class:`~specgraft.batch.BatchEngine` over this decoder's engine (token ids in,
        events out; the server schedules requests into it). ``policy`` picks each step's budget
        from the batch size (:class:`~specgraft.batch.AdaptiveBudget`); None verifies each
        request's own budget."""
        return BatchEngine(self.engine, max_batch=max_batch, policy=policy, max_queue=max_queue)

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        chat: bool | None = False,
        config: GenerationConfig | Sequence[GenerationConfig] | None = None,
        max_batch: int = 8,
        policy: BudgetPolicy | None = None,
        **kw,
    ) -> list[GenerationOutput]:
        """Generate for every prompt, ``max_batch`` at a time in one target forward per step
        (continuous batching: a finished request's place goes to the next prompt). ``config`` is
        one config for all or one per prompt (keyword arguments as :meth:`make_config`). Each
        output equals :meth:`generate` of its prompt alone: greedy token for token (float32),
        sampled with its own seed token for token with deterministic drafts (the default; with
        ``--sample-drafts`` under an adaptive ``policy`` the tokens can differ, the law cannot:
        :mod:`specgraft.batch.engine`). Stop strings end a request at the step that completes them.

        >>> outs = dec.generate_batch(["Hi", "Explain caches"], max_new_tokens=32)  # doctest: +SKIP
        >>> [o.finish_reason for o in outs]  # doctest: +SKIP
        ['stop', 'length']
        """
        if config is None:
            configs = [self.make_config(**kw)] * len(prompts)
        elif isinstance(config, GenerationConfig):
            configs = [config] * len(prompts)
        else:
            configs = list(config)
            if len(configs) != len(prompts):
                raise ValueError(f"{len(configs)} configs for {len(prompts)} prompts")
        configs = [self.resolve(c) for c in configs]
        encoded = [self.encode(p, chat) for p in prompts]
        batch = self.batch_engine(max_batch, policy)
        texts = {batch.submit(ids, c, request_id=str(i)): TextStream(self.tokenizer, c.stop_strings) for i, (ids, c) in enumerate(zip(encoded, configs))}
        outputs: dict[str, GenerationOutput] = {}
        try:
            for ev in batch.events():
                text = texts[ev.request_id]
                text.push(ev.tokens)
                if text.stopped and not ev.finished:
                    batch.cancel(ev.request_id)
                if ev.finished:
                    if ev.error is not None:
                        raise ValueError(f"request {ev.request_id}: {ev.error}")
                    text.close()
                    outputs[ev.request_id] = self._output(text, ev.stats, configs[int(ev.request_id)], ev.finish_reason)
        finally:
            batch.close()
        return [outputs[str(i)] for i in range(len(prompts))]

    def generate(self, prompt: str | Sequence[int], chat: bool | None = False, config: GenerationConfig | None = None, **kw) -> GenerationOutput:
        """Generate and return the text, the new token ids and the stats (``chat`` as :meth:`stream`)."""
        for _ in self.stream(prompt, chat=chat, config=config, **kw):
            pass
        assert self.last_output is not None
        return self.last_output

    def resolve(self, config: GenerationConfig) -> GenerationConfig:
        """``config`` as this decoder runs it: no budget means :attr:`default_budget` (the method's
        ``default_budget``; for draft-model methods, their preset's budget). ``ValueError`` when a
        gated Graft variant would apply calibrated thresholds at another budget than they were
        fitted at."""
        resolved = config.with_default_budget(self.default_budget)
        self.spec.check_budget(self.options, resolved.budget)
        return resolved

    def _resolved_gguf_config(self, config: GenerationConfig) -> dict[str, Any]:
        """:meth:`resolved_config` on the llama.cpp backend: the GGUF, its quantization, threads
        (llama.cpp's; torch's verify the trees), context cells and strict mode."""
        out = {
            "method": self.method,
            "backend": self.backend,
            "generation": self.resolve(config).to_dict(),
            "options": dataclasses.asdict(self.options),
            "dtype": self.target.quantization,
            "device": "cpu",
            "threads": self.target.threads,
            "llamacpp": _gguf_config(self.target),
        }
        if self.spec.needs_draft_model:
            out["draft_model"] = {"name_or_path": self.draft_model.name, **_gguf_config(self.draft_model)}
        return out

    def resolved_config(self, config: GenerationConfig) -> dict[str, Any]:
        """What a run prints and records: method, generation config (budget resolved), options,
        dtypes, threads, attention implementations (``specgraft_sdpa``: ``models/attention.py``),
        fused projection groups (``models/fusion.py``; 0 = the plain layout), CUDA graphs, the
        lean forward."""
        if self.backend == "llamacpp":
            return self._resolved_gguf_config(config)
        out = {
            "method": self.method,
            "backend": self.backend,
            "generation": self.resolve(config).to_dict(),
            "options": dataclasses.asdict(self.options),
            "dtype": _dtype_name(self.target.dtype),
            "device": str(self.target.device),
            "threads": torch.get_num_threads(),
            "small_input_rows": self.small_input_rows,
            "attention": getattr(self.model.config, "_attn_implementation", None),
            "fused_projections": fused_groups(self.model),
            # forwards replayed as CUDA graphs (``models/graphs.py``; on by default on a GPU)
            "cuda_graphs": replays_graphs(self.target),
            # the decoder forward as one loop of Hugging Face's ops (``models/lean.py``; on a CPU)
            "lean_forward": self.target.lean is not None,
        }
        if self.spec.needs_draft_model:
            out["draft_model"] = {
                "name_or_path": getattr(self.draft_model.config, "_name_or_path", None),
                "dtype": _dtype_name(next(self.draft_model.parameters()).dtype),
                "numerics": draft_numerics(self.draft_model),
                "attention": getattr(self.draft_model.config, "_attn_implementation", None),
                "fused_projections": fused_groups(self.draft_model),
            }
        return out


def _gguf_config(target: LlamaCppTarget) -> dict[str, Any]:
    """What a run records of a model on the llama.cpp backend."""
    return {"gguf": str(target.path), "quantization": target.quantization, "threads": target.threads, "n_ctx": target.n_ctx, "strict": target.strict}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
