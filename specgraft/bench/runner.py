"""The benchmark protocol: every method on every prompt, in one process, against plain decoding.

1. Load the target (and the draft model, if any) once; set the threads explicitly.
2. Warm up: one short generation per method on a fixed prompt that is not in any suite.
3. For each prompt and turn: run ``ar`` (plain decoding through the same adapter) first, then
   every other method, on the same token ids, same dtype, same threads; ``time.perf_counter()``
   around the generation call only.
4. Append one :class:`~specgraft.bench.records.ResultRow` per (prompt, turn, method) to
   ``results.jsonl`` as soon as it is measured; ``resume=True`` skips rows already there.
5. llama.cpp peers (``llamacpp``, ``llamacpp-pld``: llama-cpp-python, in the peers' process
   like the Hugging Face ones; ``llama-speculative``, ``llama-lookup``: llama.cpp's programs, a
   subprocess per generation) take part in every input like the Hugging Face peers, rounds
   included; ``llamacpp`` is their baseline and exactness reference, and every row is also
   compared with it (:mod:`specgraft.bench.summary`). With ``backend="llamacpp"`` our methods run
   on :class:`~specgraft.models.llamacpp.LlamaCppTarget` (the target's GGUF, the draft model's GGUF).
6. vLLM peers (``vllm``, ``vllm-ngram``, ``vllm-specgraft-*``), if asked for: after every input
   has run here, our models are released and each vLLM peer runs once over the same token ids in
   vLLM's own venv (:mod:`specgraft.bench.vllm_peers`); ``vllm`` is their baseline and exactness
   reference, as ``hf`` is for the Hugging Face peers.
7. Write ``report.md`` and the plots (:mod:`specgraft.bench.report`).

A second turn (MT-bench) is the chat of turn 1, ``ar``'s own answer to it, and turn 2; every
method gets those same ids. Speedup per task = total ``ar`` time / total method time over the
task's generations; the overall figure is the same ratio over all generations.

Example::

    from specgraft.bench import BenchConfig, run_benchmark
    report = run_benchmark(BenchConfig(model="qwen2.5-coder-1.5b-instruct", suite="spec-bench:3,humaneval:6",
                                       methods=("ar", "pld", "recycling", "hf", "hf-pld"), out="bench-out"))
    print(report.read_text())
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import itertools
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console

from specgraft.agreement import agreement
from specgraft.bench.contract import BenchMethod, MethodRun, SpecgraftMethod, with_max_new_tokens
from specgraft.suites import BenchPrompt, Suite, load_suite, parse_suite_spec
from specgraft.bench.environment import environment
from specgraft.bench.llamacpp_peers import (
    LLAMACPP_BASELINE, LLAMACPP_PEERS, LLAMACPP_PYTHON_PEERS, LLAMACPP_TOOL_PEERS, LlamaCppPeer, peer_threads,
)
from specgraft.bench.llamacpp_tools import LlamaToolPeer, default_tools_dir, find_tool
from specgraft.bench.peer_process import PEER_PROCESSES, PeerProcess, PeerProcessError, PeerSpec, RemotePeer
from specgraft.bench.peers import PEERS, HFPeer
from specgraft.bench.records import AR_END, RESULTS_FILE, ResultRow, append_row, read_rows
from specgraft.bench.repetition import self_repetition
from specgraft.bench.summary import own_plain
from specgraft.bench.vllm_peers import VLLM_BASELINE, VLLM_PEERS, VLLMSettings, check_vllm_python, default_vllm_python, run_vllm_peer
from specgraft.methods import GRAFT_METHODS, LEARNING, METHODS, GraftOptions, MethodOptions, method_budget, method_names, with_sampled_drafts
from specgraft.methods.graft import check_calibration_budget
from specgraft.models.loading import load_draft_model

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
    draft_model: str | None = None
    """Draft model (same tokenizer as the target), loaded once for ``hf-assisted``, ``draft-tree``
    and the Graft variants."""
    draft_quant: str = "auto"
    """Numerics of the draft model (``int8``, ``bf16``, ``fp16``, ``none``; ``auto``: int8 on CPU,
    bf16 on a GPU; ``GraftOptions.draft_quant``); ``hf-assisted`` gets the same loaded draft. The
    resolved one is recorded (``resolved_draft_quant``)."""
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
    recycling_state: str | None = None
    """Successor matrix (.npz from ``specgraft warmup``) that Token Recycling starts from."""
    calibration: str | None = None
    """Calibration JSON from ``specgraft calibrate`` for the Graft variants (thresholds + matrix)."""
    preset: str = "cpu"
    """Draft tree preset of ``draft-tree`` and the Graft variants (``cpu`` or ``gpu``, see
    ``drafters/draft_model.py``); with no ``budget`` they verify its budget."""
    sample_drafts: bool = False
    """``draft-tree`` and the Graft variants sample draft children at ``temperature`` (> 0) and
    verify by rejection sampling (``GraftOptions.sample_drafts``)."""
    draft_extend: int | None = None
    """Extension forwards of the draft tree past its depth (``GraftOptions.extend``); None = the preset's."""
    draft_stop_min: float | None = None
    """Early stop of the draft tree (``GraftOptions.stop_min``); None = the preset's."""
    draft_row_cost: float | None = None
    """Cost-aware cut of ``draft-tree``'s nodes (``GraftOptions.row_cost``); None = the preset's."""
    draft_copy_ahead: int | None = None
    """Rows an extension forward guesses from the context (``GraftOptions.copy_ahead``); None = the preset's."""
    warmup_tokens: int = 16
    """New tokens of each method's warm-up generation."""
    device: str = "auto"
    """Of the target and the draft model: ``auto`` is cuda when a GPU is available, else cpu (the
    resolved device is recorded: ``resolved_device``)."""
    learning: str = "request"
    """``request``: every input starts from the shared drafter state (priors, the warmed-up
    matrix), so a row does not depend on which inputs ran before it, in this session or an
    earlier one; ``shared``: what one input teaches the drafters carries over to the next
    (``MethodOptions.learning``)."""
    datastores: tuple[str, ...] = ()
    """Datastore directories the reader methods search (``MethodOptions.datastores``)."""
    reader_shape: str | None = None
    """READER's tree shape from ``specgraft tune`` (default: ``ReaderConfig``'s)."""
    cost_table: str | None = None
    """Cost table the default budgets are derived from (``MethodOptions.cost_table``; the CLI
    resolves ``--cost-table auto``); None: the fixed defaults. The budgets used are recorded."""
    row_cost: float | None = None
    """Relative cost of a verified row for ``pld`` and the AdaPLD methods' cost-aware pruning
    (``MethodOptions.row_cost``; the CLI resolves ``--row-cost auto`` from the cost table)."""
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
    ``/work/.venv-vllm/bin/python`` (the resolved one is recorded in the rows)."""
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
        from specgraft.config import SamplingConfig
        from specgraft.models.hf import parse_dtype

        methods = self.methods.split(",") if isinstance(self.methods, str) else list(self.methods)
        methods = [m.strip() for m in methods if m.strip()]
        if not self.model:
            raise ValueError("no model given")
        backend = self.resolved_backend  # an unknown backend is an error
        if methods == ["all"]:
            ours = [m for m in method_names() if self.draft_model or not METHODS[m].needs_draft_model]
            if backend == "llamacpp":
                ours = [m for m in ours if not METHODS[m].needs_hidden_states]
                peers = [*LLAMACPP_PYTHON_PEERS, *(LLAMACPP_TOOL_PEERS if self.resolved_llamacpp_tools else ())]
                methods = [*ours, *(p for p in peers if p != "llama-speculative" or self.draft_model)]
            else:
                methods = [*ours, *(p for p in PEERS if p != "hf-assisted" or self.draft_model)]
        object.__setattr__(self, "methods", tuple(methods))
        object.__setattr__(self, "datastores", tuple(str(p) for p in self.datastores))
        if not self.out:
            raise ValueError("no output directory given")
        known = list(method_names()) + list(PEERS) + list(LLAMACPP_PEERS) + list(VLLM_PEERS)
        for m in methods:
            if m not in METHODS and m not in PEERS and m not in LLAMACPP_PEERS and m not in VLLM_PEERS:
                raise ValueError(f"unknown method {m!r}; choose from {', '.join(known)}")
        if len(set(methods)) != len(methods):
            raise ValueError(f"a method is listed twice in {','.join(methods)}")
        if "hf-assisted" in methods and not self.draft_model:
            raise ValueError("method hf-assisted needs --draft-model")
        if "llama-speculative" in methods and not self.draft_model:
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
        if self.learning not in LEARNING:
            raise ValueError(f"learning must be one of {', '.join(LEARNING)}, got {self.learning!r}")
        for method, budget in self.budgets.items():
            if method in GRAFT_METHODS:
                check_calibration_budget(method, self.method_options().graft, budget)

    def _check_backend(self, methods: Sequence[str]) -> None:
        """What the llama.cpp backend refuses, each in one line (the hf backend: ``strict``)."""
        from specgraft.models.backends import is_gguf_file

        if self.resolved_backend == "hf":
            if self.strict:
                raise ValueError("strict mode is the llama.cpp backend's (the hf backend in float32 is exact as it is); add --backend llamacpp")
        else:
            if self.dtype != "auto":
                raise ValueError(f"--dtype {self.dtype}: the llama.cpp backend computes in the GGUF's own quantization; drop --dtype")
            if self.device not in ("auto", "cpu"):
                raise ValueError(f"--device {self.device}: the llama.cpp backend runs on the CPU here")
            if self.draft_quant != "auto" and "hf-assisted" not in methods:
                raise ValueError(
                    f"--draft-quant {self.draft_quant}: on the llama.cpp backend the draft model computes in its GGUF's own "
                    "quantization (--draft-quant is for hf-assisted's draft); drop --draft-quant"
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
        from specgraft.models.backends import resolve_backend

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
        from specgraft.models.hf import resolve_device

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
        ``gguf`` on the llama.cpp backend unless ``hf-assisted`` loads a draft model in torch."""
        from specgraft.models.quant import resolve_draft_quant

        if not self.draft_model:
            return None
        if self.resolved_backend == "llamacpp" and "hf-assisted" not in self.methods:
            return "gguf"
        return resolve_draft_quant(self.draft_quant, self.resolved_device)

    @property
    def resolved_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved on this machine and device, e.g. ``"float32"``;
        ``gguf`` on the llama.cpp backend (the GGUF's own quantization computes; the report names it)."""
        from specgraft.models.hf import parse_dtype

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
        """The options every registry method is built with."""
        graft = GraftOptions(
            draft_model=self.draft_model, draft_dtype=self.dtype, draft_quant=self.draft_quant, preset=self.preset, calibration=self.calibration,
            extend=self.draft_extend, stop_min=self.draft_stop_min, row_cost=self.draft_row_cost, copy_ahead=self.draft_copy_ahead,
        )
        if self.sample_drafts:
            graft = with_sampled_drafts(graft, self.temperature)
        from specgraft.methods.reader import reader_config

        reader = reader_config(self.reader_shape, self.model, self.draft_model, self.preset)
        return MethodOptions(
            recycling_state=self.recycling_state, graft=graft, learning=self.learning, datastores=tuple(self.datastores), reader=reader,
            row_cost=self.row_cost, cost_table=self.cost_table,
        )

    def comparable(self) -> dict[str, Any]:
        """Fields that must be equal for rows from two sessions to be reported together
        (``budgets`` only for the methods both sessions run)."""
        keep = ("model", "draft_model", "resolved_draft_quant", "max_new_tokens", "temperature", "resolved_dtype", "seed", "budgets", "threads",
                "recycling_state", "calibration", "bracket", "preset", "sample_drafts", "resolved_device", "learning", "datastores", "reader_shape",
                "vllm_spec_tokens", "row_cost", "draft_extend", "draft_stop_min", "draft_row_cost", "draft_copy_ahead", "resolved_peer_process",
                "rounds", "resolved_backend", "strict", "llamacpp_draft_max")
        out = {k: getattr(self, k) for k in keep}
        out["datastores"] = list(self.datastores)  # as run.json stores it
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_command(self) -> str:
        """The equivalent ``specgraft bench`` command line.

        >>> BenchConfig(model="m", out="o", suite="humaneval:2").to_command()
        'specgraft bench --model m --methods ar,pld,recycling --suite humaneval:2 --max-new-tokens 128 --temperature 0.0 --dtype auto --seed 0 --cost-table none --out o'
        """
        parts = ["specgraft", "bench", "--model", self.model]
        if self.draft_model:
            parts += ["--draft-model", self.draft_model]
        if self.draft_quant != "auto":
            parts += ["--draft-quant", self.draft_quant]
        parts += ["--methods", ",".join(self.methods), "--suite", self.suite]
        if self.per_task is not None:
            parts += ["--per-task", str(self.per_task)]
        parts += ["--max-new-tokens", str(self.max_new_tokens), "--temperature", str(self.temperature)]
        parts += ["--dtype", self.dtype, "--seed", str(self.seed)]
        if self.budget is not None:
            parts += ["--budget", str(self.budget)]
        if self.row_cost is not None:
            parts += ["--row-cost", str(self.row_cost)]
        parts += ["--cost-table", self.cost_table or "none"]
        if self.threads is not None:
            parts += ["--threads", str(self.threads)]
        if self.alpaca_path:
            parts += ["--alpaca-path", self.alpaca_path]
        if self.recycling_state:
            parts += ["--recycling-state", self.recycling_state]
        if self.calibration:
            parts += ["--calibration", self.calibration]
        if self.preset != "cpu":
            parts += ["--preset", self.preset]
        if self.sample_drafts:
            parts += ["--sample-drafts"]
        if self.draft_extend is not None:
            parts += ["--draft-extend", str(self.draft_extend)]
        if self.draft_stop_min is not None:
            parts += ["--draft-stop-min", str(self.draft_stop_min)]
        if self.draft_row_cost is not None:
            parts += ["--draft-row-cost", str(self.draft_row_cost)]
        if self.draft_copy_ahead is not None:
            parts += ["--draft-copy-ahead", str(self.draft_copy_ahead)]
        if self.device != "auto":
            parts += ["--device", self.device]
        if self.learning != "request":
            parts += ["--learning", self.learning]
        for path in self.datastores:
            parts += ["--datastore", path]
        if self.reader_shape:
            parts += ["--reader-shape", self.reader_shape]
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
        parts += ["--out", self.out]
        return " ".join(shlex.quote(p) for p in parts)


# -- prompts ------------------------------------------------------------------------------


def conversation_ids(tokenizer, turns: Sequence[str], answers: Sequence[str], chat: bool) -> list[int]:
    """Token ids of the last of ``turns``, after the earlier turns and their ``answers``.

    With ``chat`` the message list ``[user t0, assistant a0, user t1, ...]`` goes through
    ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``; for one turn this is
    exactly :meth:`SpecDecoder.encode(prompt, chat=True)`. Without a chat template the parts are
    joined by blank lines, e.g. ``turns=["Hi", "More"], answers=["Hello"]`` -> ``"Hi\\n\\nHello\\n\\nMore"``.
    """
    assert len(answers) == len(turns) - 1, f"{len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}"
    if chat:
        messages: list[dict[str, str]] = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        parts = [p for pair in zip(turns, [*answers, ""]) for p in pair][:-1]
        ids = tokenizer("\n\n".join(parts))["input_ids"]
    if not ids:
        raise ValueError("a benchmark prompt encoded to no tokens")
    return list(ids)


def plain_answers(out_dir: str | Path, tokenizer) -> list[tuple[dict[str, Any], list[int]]]:
    """Each plain-decoding (``ar``) output of a finished bench run, first pass, one per prompt
    and turn in the order the run wrote them, as its raw result record with the exact token ids
    the target was given before it (chat template applied as the run did; a later turn holds the
    earlier turns and the model's own answers). Offline analyses of a run's answers start here
    (``benchmarks/measure_ceiling.py``, ``measure_copy_bound.py``, ``measure_reader_oracle.py``)."""
    from specgraft.suites import read_prompt_file

    out_dir = Path(out_dir)
    missing = [name for name in (RUN_FILE, RESULTS_FILE) if not (out_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{out_dir} is not a finished bench run: no {' or '.join(missing)}")
    run = json.loads((out_dir / RUN_FILE).read_text())
    prompts = {p.id: p for src in run["suite"]["sources"] for p in read_prompt_file(src, Path(src).stem)}
    ar: dict[tuple[str, int], dict[str, Any]] = {}
    for line in (out_dir / RESULTS_FILE).read_text().splitlines():
        r = json.loads(line) if line.strip() else None
        if r and r["method"] == "ar" and not r.get("peer"):
            ar.setdefault((r["prompt_id"], r["turn"]), r)  # the first pass; a later one is equal
    has_template = bool(getattr(tokenizer, "chat_template", None))
    answers = []
    for (pid, turn), r in ar.items():
        earlier = [ar[(pid, k)]["text"] for k in range(turn)]
        answers.append((r, conversation_ids(tokenizer, prompts[pid].turns[: turn + 1], earlier, r["chat"] and has_template)))
    return answers


# -- loading -----------------------------------------------------------------------------


@dataclass
class LoadedModels:
    decoder: Any  # SpecDecoder with method "ar"
    draft: Any | None  # PreTrainedModel (hf backend) or LlamaCppTarget (llamacpp backend)


def load_models(cfg: BenchConfig, options: MethodOptions) -> LoadedModels:
    """Load the target once, and the draft model once (same loader, dtype and CPU kernels as the
    target; its tokenizer must have the target's vocabulary) when one of our methods needs it or
    ``hf-assisted`` runs in this process. On the llama.cpp backend both are GGUFs in llama.cpp
    (same threads; the draft never strict: its numbers never reach the output), and the Hugging
    Face peers, if any, run in the peers' process (``BenchConfig`` refuses them here)."""
    from specgraft.api import SpecDecoder

    ours_need_draft = any(METHODS[m].needs_draft_model for m in cfg.run_methods if m in METHODS)
    hf_assisted_here = cfg.resolved_peer_process == "shared" and "hf-assisted" in cfg.run_methods
    if cfg.resolved_backend == "llamacpp":
        decoder = SpecDecoder.from_pretrained(
            cfg.model, method="ar", options=options, progress=cfg.progress, backend="llamacpp", threads=cfg.threads,
            strict=cfg.strict,
        )
        from specgraft.models.llamacpp import load_draft_gguf

        draft = load_draft_gguf(cfg.draft_model, decoder.target, progress=cfg.progress) if cfg.draft_model and ours_need_draft else None
        return LoadedModels(decoder, draft)
    decoder = SpecDecoder.from_pretrained(
        cfg.model, method="ar", dtype=cfg.dtype, device=cfg.resolved_device, options=options, progress=cfg.progress
    )
    if decoder.tokenizer is None:
        raise ValueError(f"model {cfg.model!r} has no tokenizer; the benchmark needs one")
    draft = None
    if cfg.draft_model and (ours_need_draft or hf_assisted_here):
        draft = load_draft_model(
            cfg.draft_model, cfg.dtype, decoder.target.device, progress=cfg.progress, target_tokenizer=decoder.tokenizer,
            quant=cfg.draft_quant,
        )
    return LoadedModels(decoder, draft)


def build_methods(
    cfg: BenchConfig, models: LoadedModels, options: MethodOptions, peer_process: PeerProcess | None = None
) -> dict[str, BenchMethod]:
    """One :class:`BenchMethod` per name in ``cfg.run_methods``, all over the one loaded target;
    our draft-model methods share the one loaded draft model. The Hugging Face and
    llama-cpp-python peers run in ``peer_process`` when one is given (on its own models), else
    here (the Hugging Face ones on our models, ``hf-assisted`` then sharing our draft model; the
    llama-cpp-python ones on their own ``Llama``); llama.cpp's programs run as subprocesses."""
    config = models.decoder.make_config(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed, budget=cfg.budget
    )
    eos = sorted(models.decoder.engine.eos_token_ids)
    out: dict[str, BenchMethod] = {}
    remote: dict[str, RemotePeer] = {}
    if peer_process is not None:
        remote_eos, _ = peer_process.wait_ready()
        if remote_eos != eos:
            raise PeerProcessError(f"the peers' process stops at EOS ids {remote_eos}, the bench at {eos}")
        remote = peer_process.peers()
    for name in cfg.run_methods:
        if name in remote:
            out[name] = remote[name]
        elif name in LLAMACPP_PYTHON_PEERS:
            out[name] = LlamaCppPeer(
                name, target_gguf(cfg), eos, cfg.max_new_tokens, cfg.threads, cfg.temperature, cfg.seed, cfg.llamacpp_draft_max
            )
        elif name in LLAMACPP_TOOL_PEERS:
            draft_gguf = gguf_of(cfg.draft_model, cfg.progress) if name == "llama-speculative" else None
            out[name] = LlamaToolPeer(
                name, find_tool(name, cfg.resolved_llamacpp_tools), target_gguf(cfg), draft_gguf, models.decoder.tokenizer, eos,
                cfg.max_new_tokens, cfg.threads, cfg.temperature, cfg.seed, cfg.llamacpp_draft_max,
            )
        elif name in PEERS:
            out[name] = HFPeer(
                name, models.decoder.model, eos, cfg.max_new_tokens, cfg.temperature, cfg.seed, assistant_model=models.draft
            )
        elif name == AR_END:
            out[name] = SpecgraftMethod(models.decoder.with_method("ar", options), config)
        else:
            draft = models.draft if METHODS[name].needs_draft_model else None
            out[name] = SpecgraftMethod(models.decoder.with_method(name, options, draft_model=draft), config)
    return out


def gguf_of(model: str | None, progress: bool = True) -> str:
    """The GGUF file of a model argument (a catalog name's pulled GGUF, a .gguf path...)."""
    from specgraft.models.backends import gguf_path

    assert model is not None
    return str(gguf_path(model, progress=progress))


def target_gguf(cfg: BenchConfig) -> str:
    """The target's GGUF: the file our llama.cpp backend reads, and every llama.cpp peer."""
    return gguf_of(cfg.model, cfg.progress)


def warm_up(methods: dict[str, BenchMethod], ids: list[int], tokens: int) -> None:
    """One short generation per method so no method pays for first-call allocations (a
    llama.cpp program's run also brings its GGUF into the page cache)."""
    for name, m in methods.items():
        if name == AR_END:
            continue  # the same engine kind as ar, already warm
        if m.is_peer:
            m.run(ids, max_new_tokens=tokens)
        else:
            assert isinstance(m, SpecgraftMethod)
            SpecgraftMethod(m.decoder, with_max_new_tokens(m.config, tokens)).run(ids)


# -- the run -----------------------------------------------------------------------------


@dataclass
class Session:
    """One process's share of a run: rows it measures carry its id, config and environment."""

    id: str
    cfg: BenchConfig
    environment: dict[str, Any]
    decoder: Any  # SpecDecoder, for detokenizing outputs
    stores: tuple[Any, ...] = ()
    """The run's ``--datastore`` suffix arrays (memory-mapped), for the ceiling with datastores."""


@dataclass
class Generation:
    """The input of one (prompt, turn): the same token ids for every method."""

    prompt: BenchPrompt
    turn: int
    # [prompt_tokens]
    ids: list[int]
    chat: bool
    """Whether the chat template was applied."""


_SESSIONS = itertools.count(1)


def _session_id() -> str:
    """UTC start time, process id and a count of the runs this process started: unique even when
    one process starts two runs within a second (rows pair with the baselines of their session)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}.{next(_SESSIONS)}"


# Config fields added after runs were first recorded: their value in a run.json that predates them.
#: Runs made before ``learning`` existed kept every drafter's state across the session's inputs.
#: Before ``draft_quant``, a draft model ran in the target's dtype (a run without one records None).
_RECORDED_SINCE = {
    "resolved_draft_quant": lambda before: "none" if before.get("draft_model") else None,
    "preset": "cpu", "sample_drafts": False, "resolved_device": "cpu", "learning": "shared", "datastores": [], "reader_shape": None,
    "vllm_spec_tokens": 5, "row_cost": None, "draft_extend": None,
    "draft_stop_min": None, "draft_row_cost": None, "draft_copy_ahead": None, "rounds": 1,
    # before peer_process, the peers ran in the bench's own process
    "resolved_peer_process": lambda before: "shared" if any(m in PEERS for m in before.get("run_methods", ())) else None,
    "resolved_backend": "hf", "strict": False, "llamacpp_draft_max": None,
}


def _check_resume(out: Path, cfg: BenchConfig) -> None:
    run_file = out / RUN_FILE
    if not run_file.exists():
        return
    before = json.loads(run_file.read_text())["config"]
    diff = {}
    for key, now in cfg.comparable().items():
        default = _RECORDED_SINCE.get(key)
        then = before.get(key, default(before) if callable(default) else default)
        if key == "budgets" and isinstance(then, dict):
            # a resumed session may add or drop methods: compare those both sessions run
            then = {m: b for m, b in then.items() if m in now}
            now = {m: b for m, b in now.items() if m in then}
        if key == "resolved_peer_process" and None in (then, now):
            continue  # one of the sessions ran no Hugging Face peer: nothing to compare
        if then != now:
            diff[key] = (then, now)
    if diff:
        detail = ", ".join(f"{k}: {a!r} before, {b!r} now" for k, (a, b) in diff.items())
        raise ValueError(f"cannot resume {out}: the run was made with a different config ({detail})")


def make_row(
    gen: Generation, name: str, method: BenchMethod, run: MethodRun, ar_tokens: list[int], hf_tokens: list[int] | None, session: Session,
    rounds: Sequence[MethodRun] = (),
) -> ResultRow:
    """The JSONL row of one measured generation; ``ar_tokens`` / ``hf_tokens`` are the references
    (``hf_tokens``: the peer's own engine's plain output, ``hf`` or ``llamacpp``).
    With ``rounds`` (every round's run of the input, ``run`` the first), the row's time and phase
    times are the rounds' means (``BenchConfig.rounds``)."""
    if len(rounds) > 1:
        run = dataclasses.replace(run, time_s=sum(r.time_s for r in rounds) / len(rounds))
    row = ResultRow(
        prompt_id=gen.prompt.id, task=gen.prompt.task, suite=gen.prompt.suite, turn=gen.turn, method=name,
        peer=method.is_peer, chat=gen.chat, session=session.id, prompt_tokens=len(gen.ids),
        new_tokens=len(run.tokens), time_s=round(run.time_s, 6),
        tokens_per_s=round(len(run.tokens) / run.time_s, 4) if run.time_s > 0 else 0.0,
        tokens=list(run.tokens), text=session.decoder.decode(run.tokens),
        agreement=agreement(run.tokens, ar_tokens).to_dict(),
        config={**session.cfg.to_dict(), "method_config": run.config, "chat_template": gen.chat},
        environment=session.environment,
    )
    if run.stats is not None:
        d = run.stats.to_dict()
        row.steps = run.stats.steps
        row.mat = round(run.stats.mat, 4)
        row.tokens_per_step = d["tokens_per_step"]
        row.proposed_by_source = d["proposed_by_source"]
        row.accepted_by_source = d["accepted_by_source"]
        phases = [d["time_s"]] + [r.stats.to_dict()["time_s"] for r in rounds[1:]]
        row.time_breakdown_s = {k: round(sum(p[k] for p in phases) / len(phases), 6) for k in phases[0]} if len(phases) > 1 else phases[0]
    counts = run.config.get("step_counts")
    if counts is not None and run.stats is None:
        # a peer that counts its steps (llama.cpp's); each step emits its accepted drafts + 1
        row.steps = counts["steps"]
        row.mat = round(row.new_tokens / row.steps, 4) if row.steps else None
        if counts["proposed"]:
            row.proposed_by_source = {name: counts["proposed"]}
            row.accepted_by_source = {name: counts["accepted"]}
    if len(rounds) > 1:
        row.round_times_s = [round(r.time_s, 6) for r in rounds]
    if method.is_peer and hf_tokens is not None:
        row.agreement_hf = agreement(run.tokens, hf_tokens).to_dict()
    if name == "ar":
        sr = self_repetition(gen.ids, run.tokens)
        row.self_repetition = {"response_tokens": sr.response_tokens, "advances": sr.advances}
        if session.stores:
            sr = self_repetition(gen.ids, run.tokens, stores=session.stores)
            row.self_repetition_ds = {"response_tokens": sr.response_tokens, "advances": sr.advances}
    return row


def _open_results(cfg: BenchConfig) -> tuple[Path, dict[tuple[str, int, str], ResultRow]]:
    """The results file and the rows already in it (only with ``resume``)."""
    out = Path(cfg.out)
    results = out / RESULTS_FILE
    if results.exists() and not cfg.resume:
        raise ValueError(f"{results} exists; pass --resume to continue that run or choose another --out")
    if cfg.resume:
        _check_resume(out, cfg)
    out.mkdir(parents=True, exist_ok=True)
    stored: dict[tuple[str, int, str], ResultRow] = {}
    for r in read_rows(results, repair=True):
        stored.setdefault(r.key, r)  # the first measurement of a baseline measured again later
    return results, stored


def llamacpp_info(cfg: BenchConfig, models: LoadedModels) -> dict[str, Any] | None:
    """What run.json records of the llama.cpp side: our target's GGUF, its quantization, threads,
    context and strict mode (and the draft model's), the programs' folder; None when nothing of
    llama.cpp runs."""
    if cfg.resolved_backend != "llamacpp" and not cfg.llamacpp_peers:
        return None
    out: dict[str, Any] = {"tools": cfg.resolved_llamacpp_tools, "peer_threads": peer_threads(cfg.threads)}
    if cfg.resolved_backend == "llamacpp":
        target = models.decoder.target
        out |= {"gguf": str(target.path), "quantization": target.quantization, "threads": target.threads, "n_ctx": target.n_ctx,
                "strict": target.strict}
        if models.draft is not None:
            out["draft"] = {"gguf": str(models.draft.path), "quantization": models.draft.quantization}
    return out


def _write_run_info(
    cfg: BenchConfig, suite: Suite, session: Session, notes: list[str], llamacpp: dict[str, Any] | None = None
) -> dict[str, Any]:
    run_file = Path(cfg.out) / RUN_FILE
    before = json.loads(run_file.read_text()) if run_file.exists() else {}
    # budgets of methods only earlier sessions ran stay on record for the next resume check
    budgets = {**before.get("config", {}).get("budgets", {}), **cfg.budgets}
    # likewise where an earlier session's peers ran, when this one runs none
    peer_process = cfg.resolved_peer_process or before.get("config", {}).get("resolved_peer_process")
    info = {
        "config": {
            **cfg.to_dict(), "run_methods": list(cfg.run_methods), "resolved_dtype": cfg.resolved_dtype,
            "resolved_draft_quant": cfg.resolved_draft_quant, "resolved_device": cfg.resolved_device, "budgets": budgets,
            "resolved_peer_process": peer_process, "resolved_backend": cfg.resolved_backend,
            "resolved_llamacpp_tools": cfg.resolved_llamacpp_tools,
        },
        "command": cfg.to_command(),
        "environment": session.environment,
        "suite": {"sources": list(suite.sources), "tasks": suite.tasks, "prompts": len(suite.prompts)},
        "notes": notes,
        "sessions": [*before.get("sessions", []), session.id],
    }
    if llamacpp is not None:
        info["llamacpp"] = llamacpp
    run_file.write_text(json.dumps(info, indent=2))
    return info


def progress_bar(console: Console, enabled: bool):
    """The CLI's progress bar for runs of many generations (off: every call is a no-op)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("eta"), TimeRemainingColumn(),
    )
    return Progress(*columns, console=console, disable=not enabled)


def row_line(row: ResultRow, ar: ResultRow | None, done: int, todo: int, elapsed_s: float) -> str:
    """One finished row as a log line, with the run's ETA (elapsed time per row so far x rows left).

    A progress bar does not show in a log file (``nohup``, CI); these lines do, and in a terminal
    they scroll above the bar.

    >>> from types import SimpleNamespace as R
    >>> row = R(task="qa", prompt_id="spec_bench-321", turn=0, method="pld", new_tokens=64, time_s=16.0, mat=2.0)
    >>> row_line(row, R(time_s=24.0), done=2, todo=10, elapsed_s=90.0)
    '[2/10] qa spec_bench-321 turn 1 pld: 64 tokens in 16.0 s (4.00 tok/s), MAT 2.00, 1.50x ar; eta 6:00'
    """
    rate = row.new_tokens / row.time_s if row.time_s > 0 else 0.0
    line = f"[{done}/{todo}] {row.task} {row.prompt_id} turn {row.turn + 1} {row.method}: "
    line += f"{row.new_tokens} tokens in {row.time_s:.1f} s ({rate:.2f} tok/s)"
    if row.mat is not None and row.method not in ("ar", AR_END):
        line += f", MAT {row.mat:.2f}"
    if ar is not None and row.time_s > 0 and row.method not in ("ar", AR_END):
        line += f", {ar.time_s / row.time_s:.2f}x ar"
    eta = round(elapsed_s / done * (todo - done)) if done else 0
    hours, minutes, seconds = eta // 3600, eta // 60 % 60, eta % 60
    return line + (f"; eta {hours}:{minutes:02d}:{seconds:02d}" if hours else f"; eta {minutes}:{seconds:02d}")


def to_measure(run_methods: Sequence[str], stored: dict[tuple[str, int, str], ResultRow], prompt_id: str, turn: int) -> list[str]:
    """The methods this session measures on one input (prompt, turn), in run order.

    Methods with a stored row are skipped, except the baselines: a method's speedup must come from
    an ``ar`` (and ``ar-end``) measured in the same process, so when a resumed session adds
    methods to an input whose baseline an earlier session measured, ``ar`` and ``ar-end`` run
    again; likewise ``hf`` when a Hugging Face peer is added and ``llamacpp`` when a llama.cpp
    peer is. The report pairs every row with the baselines of its own session.

    >>> from types import SimpleNamespace as R
    >>> stored = {("p", 0, m): R() for m in ("ar", "pld", "ar-end")}
    >>> to_measure(("ar", "pld", "ar-end"), stored, "p", 0)
    []
    >>> to_measure(("ar", "pld", "graft", "ar-end"), stored, "p", 0)
    ['ar', 'graft', 'ar-end']
    >>> to_measure(("ar", "graft", "ar-end"), stored, "q", 0)
    ['ar', 'graft', 'ar-end']
    >>> stored |= {("p", 0, m): R() for m in ("hf", "hf-pld")}
    >>> to_measure(("ar", "pld", "hf", "hf-pld", "hf-assisted", "ar-end"), stored, "p", 0)
    ['ar', 'hf', 'hf-assisted', 'ar-end']
    >>> stored |= {("p", 0, "llamacpp"): R()}
    >>> to_measure(("ar", "pld", "llamacpp", "llama-lookup", "ar-end"), stored, "p", 0)
    ['ar', 'llamacpp', 'llama-lookup', 'ar-end']
    """
    missing = [m for m in run_methods if (prompt_id, turn, m) not in stored]
    baselines = {"ar", AR_END}
    for m in missing:
        if (m in PEERS or m in LLAMACPP_PEERS) and m not in PLAIN_PEERS:
            baselines.add(own_plain(m))
    if all(m in baselines for m in missing):
        return missing
    return [m for m in run_methods if m in missing or m in baselines]


def round_order(run_methods: Sequence[str], rnd: int, rounds: int) -> list[str]:
    """The methods' order in round ``rnd`` (0-based) of ``rounds``: every other round reverses
    the methods between ``ar`` and ``ar-end``, which keep their places (the baseline and its
    bracket). The last round runs in the given order, so the rows, written when a method's last
    round ends, come out in run order.

    >>> round_order(("ar", "pld", "adapld", "hf", "ar-end"), 0, 2)
    ['ar', 'hf', 'adapld', 'pld', 'ar-end']
    >>> round_order(("ar", "pld", "adapld"), 1, 2), round_order(("ar", "pld", "adapld"), 0, 1)
    (['ar', 'pld', 'adapld'], ['ar', 'pld', 'adapld'])
    """
    head = [m for m in run_methods if m == "ar"]
    tail = [m for m in run_methods if m == AR_END]
    middle = [m for m in run_methods if m not in ("ar", AR_END)]
    return [*head, *(middle[::-1] if (rounds - 1 - rnd) % 2 else middle), *tail]


def run_suite(
    suite: Suite, methods: dict[str, BenchMethod], session: Session, results: Path,
    stored: dict[tuple[str, int, str], ResultRow], console: Console,
) -> list[Generation]:
    """For every prompt and turn, run ``ar`` then the other methods; append each row as it comes.
    Returns every input (prompt, turn), for the vLLM peers.

    Rows in ``stored`` are not measured again (but baselines, see :func:`to_measure`); their tokens
    still serve as references and as the ``ar`` answer a next turn is conditioned on.
    """
    cfg, decoder = session.cfg, session.decoder
    tokenizer = decoder.tokenizer
    has_template = bool(getattr(tokenizer, "chat_template", None))
    todo = cfg.rounds * sum(len(to_measure(cfg.run_methods, stored, p.id, t)) for p in suite.prompts for t in range(len(p.turns)))
    done, start = 0, time.perf_counter()
    generations: list[Generation] = []
    with progress_bar(console, cfg.progress) as bar:
        job = bar.add_task("bench", total=todo)
        for prompt in suite.prompts:
            chat = prompt.chat and has_template
            answers: list[str] = []
            for turn in range(len(prompt.turns)):
                gen = Generation(prompt, turn, conversation_ids(tokenizer, prompt.turns[: turn + 1], answers, chat), chat)
                generations.append(gen)
                ar_row: ResultRow | None = None
                # each engine's plain output (hf, llamacpp): its peers' exactness reference
                plain_tokens: dict[str, list[int]] = {}
                measure = to_measure(cfg.run_methods, stored, prompt.id, turn)
                runs: dict[str, list[MethodRun]] = {}
                for rnd in range(cfg.rounds if measure else 1):
                    # the rounds' last runs write the rows, so ar's comes first (it runs first every round)
                    for name in round_order(cfg.run_methods, rnd, cfg.rounds):
                        row = stored.get((prompt.id, turn, name))
                        if name in measure:
                            round_note = f" round {rnd + 1}/{cfg.rounds}" if cfg.rounds > 1 else ""
                            bar.update(job, description=f"{prompt.task} {prompt.id} turn {turn + 1} {name}{round_note}")
                            run = methods[name].run(gen.ids)
                            runs.setdefault(name, []).append(run)
                            bar.advance(job)
                            done += 1
                            if len(runs[name]) < cfg.rounds:
                                continue
                            first_run = runs[name][0]
                            for later in runs[name][1:]:
                                if later.tokens != first_run.tokens:
                                    raise RuntimeError(f"{name} produced other tokens in another round on {prompt.id} turn {turn + 1}")
                            reference = first_run.tokens if name == "ar" else ar_row.tokens if ar_row else None
                            assert reference is not None, "ar runs first"
                            own = first_run.tokens if name in PLAIN_PEERS else plain_tokens.get(own_plain(name))
                            row = make_row(gen, name, methods[name], first_run, reference, own, session, rounds=runs[name])
                            append_row(results, row)
                            stored.setdefault(row.key, row)
                            if cfg.progress:
                                line = row_line(row, ar_row, done, todo, time.perf_counter() - start)
                                bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
                        if row is None:
                            continue  # measured, its rounds not finished yet
                        if name == "ar":
                            ar_row = row
                        elif name in PLAIN_PEERS:
                            plain_tokens[name] = row.tokens
                # stored keeps the first ar row: the next turn is conditioned on the answer that the
                # session which first measured this input saw
                answers.append(decoder.decode(stored[(prompt.id, turn, "ar")].tokens))
    return generations


class TextOnly:
    """What a session needs of the decoder once our models are released: decoding."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def run_vllm_peers(
    generations: Sequence[Generation], session: Session, results: Path, stored: dict[tuple[str, int, str], ResultRow],
    eos: Sequence[int], warmup_ids: Sequence[int], console: Console,
) -> None:
    """Each vLLM peer over every input, in vLLM's venv (one subprocess per peer); rows as for the
    other peers, with ``vllm``'s output as the exactness reference (``agreement_hf``) and ``ar``'s
    as ``agreement``. ``vllm`` runs again on the inputs where another vLLM peer runs (its
    baseline comes from the same session)."""
    cfg = session.cfg
    from specgraft.models.resolve import resolve_model

    settings = VLLMSettings(
        model=resolve_model(cfg.model, progress=cfg.progress), python=cfg.resolved_vllm_python,
        num_speculative_tokens=cfg.vllm_spec_tokens, datastores=tuple(cfg.datastores),
    )
    version = check_vllm_python(settings.python)
    console.print(f"vLLM peers: vLLM {version} from {settings.python}, model {settings.model}")
    key = {f"{g.prompt.id}:{g.turn}": g for g in generations}
    todo = {m: [k for k, g in key.items() if (g.prompt.id, g.turn, m) not in stored] for m in cfg.vllm_methods}
    others = {k for m, ks in todo.items() if m != VLLM_BASELINE for k in ks}
    todo[VLLM_BASELINE] = [k for k in key if k in others or k in todo[VLLM_BASELINE]]
    workdir = Path(cfg.out) / "vllm"
    reference: dict[str, list[int]] = {}
    for name in cfg.vllm_methods:
        if not todo[name]:
            continue
        t0 = time.perf_counter()
        runs = run_vllm_peer(
            name, settings, [(k, key[k].ids) for k in todo[name]], eos, cfg.max_new_tokens, warmup_ids, workdir, cfg.warmup_tokens
        )
        for k in todo[name]:
            gen, run = key[k], runs[k]
            ar = stored[(gen.prompt.id, gen.turn, "ar")]
            if name == VLLM_BASELINE:
                reference[k] = run.tokens
            base = reference.get(k) or stored[(gen.prompt.id, gen.turn, VLLM_BASELINE)].tokens
            row = make_row(gen, name, _VLLMMethod(name), run, ar.tokens, base, session)
            spec = run.config.get("spec_decode")
            if spec is not None:
                row.steps = row.new_tokens - spec["accepted_tokens"]  # each step emits its accepted drafts + 1
                row.mat = round(row.new_tokens / row.steps, 4) if row.steps else None
                if name != VLLM_BASELINE:
                    row.proposed_by_source = {name: spec["draft_tokens"]}
                    row.accepted_by_source = {name: spec["accepted_tokens"]}
            append_row(results, row)
            stored.setdefault(row.key, row)
            if cfg.progress:
                plain = None if name == VLLM_BASELINE else stored.get((gen.prompt.id, gen.turn, VLLM_BASELINE))
                console.print(vllm_row_line(row, plain), markup=False, highlight=False, soft_wrap=True)
        console.print(f"{name}: {len(todo[name])} generations in {time.perf_counter() - t0:.0f} s (engine start included)")


def vllm_row_line(row: ResultRow, plain: ResultRow | None) -> str:
    """A vLLM peer's row as a log line, its speedup over plain vLLM on the same input.

    >>> from types import SimpleNamespace as R
    >>> row = R(task="qa", prompt_id="spec_bench-321", turn=0, method="vllm-ngram", new_tokens=64, time_s=4.0, mat=2.5)
    >>> vllm_row_line(row, R(time_s=6.0))
    'qa spec_bench-321 turn 1 vllm-ngram: 64 tokens in 4.0 s (16.00 tok/s), MAT 2.50, 1.50x vllm'
    """
    rate = row.new_tokens / row.time_s if row.time_s > 0 else 0.0
    line = f"{row.task} {row.prompt_id} turn {row.turn + 1} {row.method}: {row.new_tokens} tokens in {row.time_s:.1f} s ({rate:.2f} tok/s)"
    if row.mat is not None:
        line += f", MAT {row.mat:.2f}"
    if plain and row.time_s > 0:
        line += f", {plain.time_s / row.time_s:.2f}x {VLLM_BASELINE}"
    return line


@dataclass
class _VLLMMethod:
    """A vLLM peer as :func:`make_row` sees it."""

    name: str
    is_peer: bool = True


def run_benchmark(cfg: BenchConfig, console: Console | None = None) -> Path:
    """Run the benchmark described by ``cfg``; returns the path of the written ``report.md``."""
    import torch

    console = console or Console(stderr=True, highlight=False)
    suite = load_suite(cfg.suite, cfg.per_task, cfg.alpaca_path)
    results, stored = _open_results(cfg)

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    options = cfg.method_options()
    # Hugging Face peers alone load while we load; llama-cpp-python peers stop at our EOS ids, known once we have loaded
    peers_early = not any(m in LLAMACPP_PYTHON_PEERS for m in cfg.process_peers) and cfg.resolved_backend == "hf"
    processes: list[PeerProcess] = []
    if peers_early:
        processes += [p for p in [start_peer_process(cfg, console)] if p is not None]
    try:
        return _run_loaded(cfg, options, suite, results, stored, processes, console)
    finally:
        for process in processes:
            process.close()


def start_peer_process(cfg: BenchConfig, console: Console, eos: Sequence[int] | None = None) -> PeerProcess | None:
    """The child process of the Hugging Face and llama-cpp-python peers (``peer_process="separate"``),
    started so that it loads while the bench loads its own models (with ``eos``, the bench's EOS
    ids, once it has); None when the peers run here or none runs."""
    if cfg.resolved_peer_process != "separate":
        return None
    llama = any(m in LLAMACPP_PYTHON_PEERS for m in cfg.process_peers)
    spec = PeerSpec(
        model=cfg.model, dtype=cfg.dtype, device=cfg.resolved_device, threads=cfg.threads, draft_model=cfg.draft_model,
        draft_quant=cfg.draft_quant, peers=cfg.process_peers, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
        seed=cfg.seed, gguf=target_gguf(cfg) if llama else None, eos_token_ids=tuple(eos) if eos is not None else None,
        llamacpp_draft_max=cfg.llamacpp_draft_max,
    )
    process = PeerProcess(spec).start()
    if cfg.progress:
        console.print(f"peers ({', '.join(cfg.process_peers)}): loading their own models in process {process.pid}")
    return process


def _run_loaded(
    cfg: BenchConfig, options: MethodOptions, suite: Suite, results: Path, stored: dict[tuple[str, int, str], ResultRow],
    processes: list[PeerProcess], console: Console,
) -> Path:
    """The run once the peers' process (if it loads beside us: ``processes``) has started; a
    process started here is added to ``processes`` (the caller closes them)."""
    from specgraft.bench.report import write_report

    models = load_models(cfg, options)
    if not processes:
        processes += [p for p in [start_peer_process(cfg, console, sorted(models.decoder.engine.eos_token_ids))] if p is not None]
    peer_process = processes[0] if processes else None
    methods = build_methods(cfg, models, options, peer_process)
    packages = ("llama_cpp_python",) if cfg.resolved_backend == "llamacpp" or cfg.llamacpp_peers else ()
    session = Session(_session_id(), cfg, environment(cfg.resolved_dtype, packages), models.decoder)
    if cfg.datastores:
        from specgraft.retrieval import load_datastores

        session.stores = tuple(load_datastores(cfg.datastores, models.decoder.tokenizer))

    has_template = bool(getattr(models.decoder.tokenizer, "chat_template", None))
    notes = list(suite.notes)
    if not has_template and any(p.chat for p in suite.prompts):
        notes.append(f"{cfg.model} has no chat template: every prompt is given as raw text")
    for note in notes:
        console.print(f"[yellow]notice:[/yellow] {note}")
    info = _write_run_info(cfg, suite, session, notes, llamacpp_info(cfg, models))
    if cfg.progress:
        console.print(f"[bold]specgraft bench[/bold] {info['command']}")
        console.print_json(json.dumps({"config": info["config"], "environment": session.environment}))

    first_chat = bool(suite.prompts) and suite.prompts[0].chat and has_template
    warmup_ids = models.decoder.encode(WARMUP_PROMPT, chat=first_chat)
    warm_up(methods, warmup_ids, cfg.warmup_tokens)
    generations = run_suite(suite, methods, session, results, stored, console)
    if peer_process is not None:
        peer_process.close()  # its models go before vLLM loads its own
    if cfg.vllm_methods:
        eos = sorted(models.decoder.engine.eos_token_ids)
        # one model copy at a time: ours is released before vLLM loads its own
        session = dataclasses.replace(session, decoder=TextOnly(models.decoder.tokenizer))
        del methods, models
        gc.collect()
        run_vllm_peers(generations, session, results, stored, eos, warmup_ids, console)
    report = write_report(cfg.out)
    if cfg.progress:
        console.print(f"wrote {results}, {report} and {Path(cfg.out) / 'plots'}")
    return report
