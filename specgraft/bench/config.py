"""The benchmark's configuration: every setting of a run, validated, recorded in ``run.json`` and
turned back into the command that reruns it (:meth:`BenchConfig.to_command`)."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any, Sequence


from specgraft.bench.llamacpp_peers import LLAMACPP_BASELINE, LLAMACPP_PEERS, LLAMACPP_PYTHON_PEERS, LLAMACPP_TOOL_PEERS
from specgraft.bench.llamacpp_tools import default_tools_dir, find_tool
from specgraft.bench.peer_process import PEER_PROCESSES
from specgraft.bench.peers import PEERS
from specgraft.bench.records import AR_END
from specgraft.bench.vllm_peers import VLLM_BASELINE, VLLM_PEERS, default_vllm_python
from specgraft.config import SamplingConfig
from specgraft.methods import METHODS, MethodOptions, method_budget, method_names
from specgraft.methods.settings import MethodSettings
from specgraft.models.backends import gguf_path, is_gguf_file, resolve_backend
from specgraft.models.device import parse_dtype, resolve_device
from specgraft.models.gguf_requant import GGUF_DRAFT_QUANTS, resolve_gguf_draft_quant
from specgraft.models.quant import GGUF_ONLY_QUANTS, resolve_draft_quant
from specgraft.suites import parse_suite_spec

RUN_FILE = "run.json"
#: The peers that are their engines' plain decoding: the other peers' ``vs own plain`` baselines.
PLAIN_PEERS = ("hf", LLAMACPP_BASELINE)
WARMUP_PROMPT = "Say hello in one short sentence."


@dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a benchmark run; validated on construction.

    >>> BenchConfig(model="m", out="o", methods="pld,hf-pld").run_methods
    ('ar', 'pld', 'hf', 'hf-pld', 'ar-end')
    """

    model: str
    """Target: catalog name, local directory or Hugging Face id."""
    out: str
    """Output directory: results.jsonl, run.json, report.md, plots/."""
    methods: tuple[str, ...] = ("ar", "pld", "recycling")
    """Registry methods and peers (``hf``, ``hf-pld``, ``hf-assisted``; ``llamacpp``,
    ``llamacpp-pld``, ``llama-speculative``, ``llama-lookup``); a comma string is split;
    ``"all"`` = every registry method and every Hugging Face peer (those that need a draft model, such as
    ``draft-tree``, the Graft variants and ``hf-assisted``, only when one is given); on the
    llama.cpp backend every registry method that runs there and the llama.cpp peers (the
    programs only with ``llamacpp_tools``).
    ``ar`` always runs (it is the baseline), ``hf`` whenever a Hugging Face peer runs and
    ``llamacpp`` whenever a llama.cpp peer runs (the peers' baselines)."""
    suite: str = "spec-bench"
    """Comma list of ``spec-bench``, ``humaneval``, ``mt-bench``, ``eagle``, ``code-edit`` or JSONL paths, each
    optionally ``:N`` for its own prompts per task, e.g. ``spec-bench:3,humaneval:6``."""
    settings: MethodSettings = field(default_factory=MethodSettings)
    """The methods' knobs as flags give them (draft model and its numerics, preset, tree knobs,
    calibration, datastores, READER's shape, row cost, cost table, learning), resolved for the
    model, ``dtype`` and ``temperature`` by :meth:`method_options`; ``draft_model`` also loads
    ``hf-assisted``'s and ``llama-speculative``'s draft. ``run.json`` records them beside the
    other fields (:meth:`to_dict`)."""
    per_task: int | None = None
    """First N prompts of each task, in file order (None = all)."""
    max_new_tokens: int = 128
    temperature: float = 0.0
    """0 = greedy."""
    dtype: str = "auto"
    """Of the target and the draft model; ``auto`` is float32 on CPUs and bfloat16 on GPUs;
    the resolved dtype is recorded (``resolved_dtype``)."""
    seed: int = 0
    """Sampling seed (ours and the peers'), and torch's global seed."""
    budget: int | None = None
    """Tree nodes verified per step, for every registry method; None = each method's
    ``default_budget``, and the preset's budget for the draft-model methods (the resolved ones
    are recorded: :attr:`budgets`)."""
    threads: int | None = None
    """torch threads; None keeps torch's default (it is recorded either way)."""
    resume: bool = False
    """Append to an existing results.jsonl, skipping finished (prompt, turn, method) rows."""
    alpaca_path: str | None = None
    """EAGLE's alpaca set (CC BY-NC 4.0, not packaged); default ../shared/data/bench/alpaca_eagle80.jsonl."""
    warmup_tokens: int = 16
    """New tokens of each method's warm-up generation."""
    device: str = "auto"
    """Of the target and the draft model: ``auto`` is cuda when a GPU is available, else cpu (the
    resolved device is recorded: ``resolved_device``)."""
    bracket: bool = True
    """Run ``ar`` again after the other methods on every input (rows named ``ar-end``); speedups
    then use the mean of the two ``ar`` times, which cancels a slow drift of the machine's speed
    over the minutes a prompt takes, and the report prints how far the two runs differ."""
    rounds: int = 1
    """Times every input's methods run; in every other round the methods between ``ar`` and
    ``ar-end`` run in reverse order (the last round in the given one). A row keeps the mean time
    (and mean phase times) of its rounds, each round's time in ``round_times_s``, and the tokens
    and step counts of its first round (a round that produces other tokens is an error: greedy
    runs and seeded sampling repeat exactly). On a machine whose speed drifts within a run, the
    order's drift cancels across two rounds and random swings average out; the HF peers take
    part, the vLLM peers run once."""
    progress: bool = True
    """Show a progress bar and print the resolved config."""
    vllm_python: str | None = None
    """Python of the vLLM venv that runs the vLLM peers; None = ``$SPECGRAFT_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` in the working directory (the resolved one is recorded in the rows)."""
    vllm_spec_tokens: int = 5
    """``num_speculative_tokens`` of every speculative vLLM peer."""
    backend: str = "auto"
    """Of our methods' target and draft model (:mod:`specgraft.models.backends`): ``hf``
    (transformers on torch), ``llamacpp`` (their GGUFs through llama.cpp, ``threads`` reaching
    llama.cpp; ``dtype`` must stay ``auto``), or ``auto`` (``llamacpp`` for a ``.gguf`` file,
    else ``hf``; the resolved one is recorded: ``resolved_backend``)."""
    strict: bool = False
    """The llama.cpp backend's strict mode (``LlamaCppTarget``): every forward padded so every
    method equals this backend's own ``ar`` token for token; ``ar`` is then a padded plain
    decoding, and the speed bar is the ``llamacpp`` peer."""
    llamacpp_tools: str | None = None
    """Folder holding llama.cpp's ``llama-speculative`` and ``llama-lookup``; None =
    ``$SPECGRAFT_LLAMACPP_TOOLS`` (the resolved one is recorded: ``resolved_llamacpp_tools``)."""
    llamacpp_draft_max: int | None = None
    """Draft tokens per step of ``llama-speculative`` and ``llama-lookup``
    (``--spec-draft-n-max``) and ``llamacpp-pld``'s ``num_pred_tokens``; None = their own
    defaults (3, 3 and 10)."""
    peer_process: str = "separate"
    """Where the Hugging Face and llama-cpp-python peers run: ``separate``, a child process that loads its own copy of
    the models (what a peer's ``generate`` leaves in a process slowed our methods there, see
    :mod:`specgraft.bench.peer_process`; costs a second copy of the models in memory); ``shared``,
    this process, on our model objects."""

    def __post_init__(self) -> None:
        methods = self.methods.split(",") if isinstance(self.methods, str) else list(self.methods)
        methods = [m.strip() for m in methods if m.strip()]
        if not self.model:
            raise ValueError("no model given")
        backend = self.resolved_backend  # an unknown backend is an error
        if methods == ["all"]:
            ours = [m for m in method_names() if self.settings.draft_model or not METHODS[m].needs_draft_model]
            if backend == "llamacpp":
                ours = [m for m in ours if not METHODS[m].needs_hidden_states]
                peers = [*LLAMACPP_PYTHON_PEERS, *(LLAMACPP_TOOL_PEERS if self.resolved_llamacpp_tools else ())]
                methods = [*ours, *(p for p in peers if p != "llama-speculative" or self.settings.draft_model)]
            else:
                methods = [*ours, *(p for p in PEERS if p != "hf-assisted" or self.settings.draft_model)]
        object.__setattr__(self, "methods", tuple(methods))
        if not self.out:
            raise ValueError("no output directory given")
        known = list(method_names()) + list(PEERS) + list(LLAMACPP_PEERS) + list(VLLM_PEERS)
        for m in methods:
            if m not in METHODS and m not in PEERS and m not in LLAMACPP_PEERS and m not in VLLM_PEERS:
                raise ValueError(f"unknown method {m!r}; choose from {', '.join(known)}")
        if len(set(methods)) != len(methods):
            raise ValueError(f"a method is listed twice in {','.join(methods)}")
        if "hf-assisted" in methods and not self.settings.draft_model:
            raise ValueError("method hf-assisted needs --draft-model")
        if "llama-speculative" in methods and not self.settings.draft_model:
            raise ValueError("method llama-speculative needs --draft-model (its GGUF is -md)")
        self._check_backend(methods)
        for m in methods:
            if m in LLAMACPP_TOOL_PEERS:
                find_tool(m, self.resolved_llamacpp_tools)  # missing: one line saying how to build it
        if self.llamacpp_draft_max is not None and (not isinstance(self.llamacpp_draft_max, int) or self.llamacpp_draft_max < 1):
            raise ValueError(f"llamacpp_draft_max must be an integer >= 1, got {self.llamacpp_draft_max!r}")
        options = self.method_options()
        for m in methods:
            if m in METHODS:
                METHODS[m].check(options)  # e.g. draft-tree without --draft-model, a missing calibration
                METHODS[m].check_backend(self.resolved_backend)  # AdaPLD on llama.cpp
        for spec in self.suite.split(","):
            parse_suite_spec(spec)
        if self.per_task is not None and self.per_task < 1:
            raise ValueError(f"per_task must be >= 1, got {self.per_task}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.budget is not None and (not isinstance(self.budget, int) or self.budget < 1):
            raise ValueError(f"budget must be an integer >= 1, got {self.budget!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.vllm_spec_tokens < 1:
            raise ValueError(f"vllm_spec_tokens must be >= 1, got {self.vllm_spec_tokens}")
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if self.warmup_tokens < 1:
            raise ValueError(f"warmup_tokens must be >= 1, got {self.warmup_tokens}")
        SamplingConfig(temperature=self.temperature, seed=self.seed)
        if backend == "hf":
            parse_dtype(self.dtype, self.resolved_device)
            self.resolved_draft_quant  # int8 off the CPU is an error
        if self.peer_process not in PEER_PROCESSES:
            raise ValueError(f"peer_process must be one of {', '.join(PEER_PROCESSES)}, got {self.peer_process!r}")
        for method, budget in self.budgets.items():
            if method in METHODS:
                METHODS[method].check_budget(self.method_options(), budget)

    def _check_backend(self, methods: Sequence[str]) -> None:
        """What the llama.cpp backend refuses, each in one line (the hf backend: ``strict``)."""
        if self.resolved_backend == "hf":
            if self.strict:
                raise ValueError("strict mode is the llama.cpp backend's (the hf backend in float32 is exact as it is); add --backend llamacpp")
        else:
            if self.dtype != "auto":
                raise ValueError(f"--dtype {self.dtype}: the llama.cpp backend computes in the GGUF's own quantization; drop --dtype")
            if self.device not in ("auto", "cpu"):
                raise ValueError(f"--device {self.device}: the llama.cpp backend runs on the CPU here")
            ours_draft = any(METHODS[m].needs_draft_model for m in methods if m in METHODS)
            if self.settings.draft_quant not in GGUF_DRAFT_QUANTS and (ours_draft or "hf-assisted" not in methods):
                raise ValueError(
                    f"--draft-quant {self.settings.draft_quant}: on the llama.cpp backend the draft model is a GGUF, which takes "
                    f"{', '.join(GGUF_DRAFT_QUANTS)} ({self.settings.draft_quant} is for hf-assisted's draft in torch)"
                )
        if self.resolved_backend == "llamacpp" and self.peer_process == "shared" and any(m in PEERS for m in methods):
            raise ValueError(
                "on the llama.cpp backend the Hugging Face peers run in a process of their own, which loads the model in torch; "
                "drop --peer-process shared"
            )
        if is_gguf_file(self.model) and any(m in PEERS for m in methods):
            raise ValueError(f"the Hugging Face peers load a Hugging Face model; {self.model!r} is a GGUF file (use its catalog name or folder)")

    @property
    def resolved_backend(self) -> str:
        """``backend`` with ``auto`` resolved for the model, e.g. ``"llamacpp"`` for a .gguf file."""
        return resolve_backend(self.backend, self.model)

    @property
    def resolved_llamacpp_tools(self) -> str | None:
        """``llamacpp_tools``, else ``$SPECGRAFT_LLAMACPP_TOOLS``, else None."""
        return self.llamacpp_tools or default_tools_dir()

    @property
    def run_methods(self) -> tuple[str, ...]:
        """Run order per prompt: ``ar``, our other methods, ``hf`` and the other Hugging Face
        peers, ``llamacpp`` and the other llama.cpp peers, then ``ar-end`` (``ar`` again) when
        bracketing.

        >>> BenchConfig(model="m", out="o", methods="pld,llamacpp-pld,hf").run_methods
        ('ar', 'pld', 'hf', 'llamacpp', 'llamacpp-pld', 'ar-end')
        """
        ours = [m for m in self.methods if m in METHODS and m != "ar"]
        peers = [m for m in self.methods if m in PEERS and m != "hf"]
        if peers or "hf" in self.methods:
            peers = ["hf", *peers]
        llama = [m for m in self.methods if m in LLAMACPP_PEERS and m != LLAMACPP_BASELINE]
        if llama or LLAMACPP_BASELINE in self.methods:
            llama = [LLAMACPP_BASELINE, *llama]
        return ("ar", *ours, *peers, *llama, *((AR_END,) if self.bracket else ()))

    @property
    def vllm_methods(self) -> tuple[str, ...]:
        """vLLM peers in run order, ``vllm`` (their baseline) first whenever one runs.

        >>> BenchConfig(model="m", out="o", methods="pld,vllm-ngram").vllm_methods
        ('vllm', 'vllm-ngram')
        """
        asked = [m for m in self.methods if m in VLLM_PEERS and m != VLLM_BASELINE]
        return (VLLM_BASELINE, *asked) if asked or VLLM_BASELINE in self.methods else ()

    @property
    def resolved_vllm_python(self) -> str:
        return self.vllm_python or default_vllm_python()

    @property
    def resolved_device(self) -> str:
        """``device`` with ``auto`` resolved on this machine, e.g. ``"cpu"`` (always on the
        llama.cpp backend, and for the Hugging Face peers beside it)."""
        if self.resolved_backend == "llamacpp":
            return "cpu"
        return str(resolve_device(self.device))

    @property
    def hf_peers(self) -> tuple[str, ...]:
        """The Hugging Face peers that run, in run order (``hf`` first whenever one runs)."""
        return tuple(m for m in self.run_methods if m in PEERS)

    @property
    def llamacpp_peers(self) -> tuple[str, ...]:
        """The llama.cpp peers that run, in run order (``llamacpp`` first whenever one runs)."""
        return tuple(m for m in self.run_methods if m in LLAMACPP_PEERS)

    @property
    def process_peers(self) -> tuple[str, ...]:
        """The peers ``peer_process`` places: the Hugging Face and llama-cpp-python ones."""
        return tuple(m for m in self.run_methods if m in PEERS or m in LLAMACPP_PYTHON_PEERS)

    @property
    def resolved_peer_process(self) -> str | None:
        """``peer_process`` when a Hugging Face or llama-cpp-python peer runs, else None (it then
        changes nothing)."""
        return self.peer_process if self.process_peers else None

    @property
    def resolved_draft_quant(self) -> str | None:
        """``draft_quant`` with ``auto`` resolved for the device (None without a draft model);
        on the llama.cpp backend, unless ``hf-assisted`` loads a draft model in torch, ``gguf``
        (the draft's GGUF as it is) or ``gguf-q4_0`` / ``gguf-q8_0`` (requantized:
        ``models/gguf_requant.py``; resolving ``auto`` reads the draft's GGUF, pulling it first)."""
        if not self.settings.draft_model:
            return None
        if self.resolved_backend == "llamacpp" and "hf-assisted" not in self.methods:
            quant = self.settings.draft_quant
            if quant == "auto":
                quant = resolve_gguf_draft_quant(quant, gguf_path(self.settings.draft_model, progress=self.progress))
            return "gguf" if quant == "none" else f"gguf-{quant}"
        return resolve_draft_quant(self.hf_draft_quant, self.resolved_device)

    @property
    def hf_draft_quant(self) -> str:
        """``draft_quant`` as a draft model in torch takes it (``hf-assisted``'s on the llama.cpp
        backend): ``auto`` for the GGUF requantizations.

        >>> BenchConfig(model="m.gguf", out="o", settings=MethodSettings(draft_model="d.gguf", draft_quant="q4_0")).hf_draft_quant
        'auto'
        """
        return "auto" if self.settings.draft_quant in GGUF_ONLY_QUANTS else self.settings.draft_quant

    @property
    def resolved_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved on this machine and device, e.g. ``"float32"``;
        ``gguf`` on the llama.cpp backend (the GGUF's own quantization computes; the report names it)."""
        if self.resolved_backend == "llamacpp":
            return "gguf"
        return str(parse_dtype(self.dtype, self.resolved_device)).replace("torch.", "")

    @property
    def budgets(self) -> dict[str, int]:
        """Nodes verified per step by each registry method that runs: ``budget``, else its default
        (draft-model methods: the preset's budget).

        >>> BenchConfig(model="m", out="o", methods="pld").budgets
        {'ar': 1, 'pld': 16}
        """
        options = self.method_options()
        return {m: self.budget if self.budget is not None else method_budget(m, options) for m in self.run_methods if m in METHODS}

    def method_options(self) -> MethodOptions:
        """The options every registry method is built with: :attr:`settings` for the model,
        the draft model in ``dtype``, sampled drafts at ``temperature``."""
        return self.settings.options(self.model, self.dtype, self.temperature)

    def comparable(self) -> dict[str, Any]:
        """Fields that must be equal for rows from two sessions to be reported together
        (``budgets`` only for the methods both sessions run)."""
        keep = ("model", "draft_model", "resolved_draft_quant", "max_new_tokens", "temperature", "resolved_dtype", "seed", "budgets", "threads",
                "recycling_state", "calibration", "bracket", "preset", "sample_drafts", "resolved_device", "learning", "datastores", "reader_shape",
                "vllm_spec_tokens", "row_cost", "draft_depth", "draft_top_k", "draft_extend", "draft_stop_min", "draft_row_cost", "draft_copy_ahead",
                "resolved_peer_process",
                "rounds", "resolved_backend", "strict", "llamacpp_draft_max")
        record = self.settings.record()  # as run.json stores it
        return {k: record[k] if k in record else getattr(self, k) for k in keep}

    def to_dict(self) -> dict[str, Any]:
        """Every field, :attr:`settings`' beside the others (one flat record, as ``run.json``
        and each result row keep it; :meth:`from_dict` reads it back)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "settings"}
        return out | self.settings.record()

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> BenchConfig:
        """A config from one flat mapping of its fields and :class:`MethodSettings`' (what
        :meth:`to_dict` writes; unknown keys, such as ``run.json``'s resolved ones, are an error).

        >>> cfg = BenchConfig.from_dict({"model": "m", "out": "o", "methods": "pld", "draft_extend": 8})
        >>> cfg.settings.draft_extend, BenchConfig.from_dict(cfg.to_dict()) == cfg
        (8, True)
        """
        names = MethodSettings.names()
        settings = MethodSettings(**{k: v for k, v in record.items() if k in names})
        return cls(**{k: v for k, v in record.items() if k not in names}, settings=settings)

    def to_command(self) -> str:
        """The equivalent ``specgraft bench`` command line.

        >>> BenchConfig(model="m", out="o", suite="humaneval:2").to_command()
        'specgraft bench --model m --methods ar,pld,recycling --suite humaneval:2 --max-new-tokens 128 --temperature 0.0 --dtype auto --seed 0 --cost-table none --out o'
        """
        parts = ["specgraft", "bench", "--model", self.model, "--methods", ",".join(self.methods), "--suite", self.suite]
        if self.per_task is not None:
            parts += ["--per-task", str(self.per_task)]
        parts += ["--max-new-tokens", str(self.max_new_tokens), "--temperature", str(self.temperature)]
        parts += ["--dtype", self.dtype, "--seed", str(self.seed)]
        if self.budget is not None:
            parts += ["--budget", str(self.budget)]
        if self.threads is not None:
            parts += ["--threads", str(self.threads)]
        if self.alpaca_path:
            parts += ["--alpaca-path", self.alpaca_path]
        if self.device != "auto":
            parts += ["--device", self.device]
        if not self.bracket:
            parts += ["--no-bracket"]
        if self.rounds != 1:
            parts += ["--rounds", str(self.rounds)]
        if self.vllm_python:
            parts += ["--vllm-python", self.vllm_python]
        if self.vllm_spec_tokens != 5:
            parts += ["--vllm-spec-tokens", str(self.vllm_spec_tokens)]
        if self.peer_process != "separate":
            parts += ["--peer-process", self.peer_process]
        if self.backend != "auto":
            parts += ["--backend", self.backend]
        if self.strict:
            parts += ["--strict"]
        if self.llamacpp_tools:
            parts += ["--llamacpp-tools", self.llamacpp_tools]
        if self.llamacpp_draft_max is not None:
            parts += ["--llamacpp-draft-max", str(self.llamacpp_draft_max)]
        parts += self.settings.flags()
        parts += ["--out", self.out]
        return " ".join(shlex.quote(p) for p in parts)


# -- prompts ------------------------------------------------------------------------------


