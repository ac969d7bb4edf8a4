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
import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console

from specgraft.api import SpecDecoder
from specgraft.bench.config import PLAIN_PEERS, WARMUP_PROMPT, BenchConfig
from specgraft.bench.contract import BenchMethod, MethodRun, SpecgraftMethod, with_max_new_tokens
from specgraft.bench.environment import environment
from specgraft.bench.llamacpp_peers import LLAMACPP_PEERS, LLAMACPP_PYTHON_PEERS, LLAMACPP_TOOL_PEERS, LlamaCppPeer, peer_threads
from specgraft.bench.llamacpp_tools import LlamaToolPeer, find_tool
from specgraft.bench.peer_process import PeerProcess, PeerProcessError, PeerSpec, RemotePeer
from specgraft.bench.peers import PEERS, HFPeer
from specgraft.bench.records import AR_END, ResultRow, append_row
from specgraft.bench.report import write_report
from specgraft.bench.session import Generation, Session, make_row, open_results, session_id, write_run_info
from specgraft.bench.summary import own_plain
from specgraft.bench.vllm_peers import VLLM_BASELINE, VLLMSettings, check_vllm_python, run_vllm_peer
from specgraft.methods import METHODS, MethodOptions
from specgraft.models.backends import gguf_path
from specgraft.models.gguf_requant import draft_gguf
from specgraft.models.llamacpp import load_draft_gguf
from specgraft.models.loading import load_draft_model
from specgraft.models.resolve import resolve_model
from specgraft.progress import progress_bar
from specgraft.retrieval import load_datastores
from specgraft.suites import Suite, conversation_ids, load_suite

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
    ours_need_draft = any(METHODS[m].needs_draft_model for m in cfg.run_methods if m in METHODS)
    hf_assisted_here = cfg.resolved_peer_process == "shared" and "hf-assisted" in cfg.run_methods
    if cfg.resolved_backend == "llamacpp":
        decoder = SpecDecoder.from_pretrained(
            cfg.model, method="ar", options=options, progress=cfg.progress, backend="llamacpp", threads=cfg.threads,
            strict=cfg.strict,
        )
        draft = None
        if cfg.settings.draft_model and ours_need_draft:
            draft = load_draft_gguf(cfg.settings.draft_model, decoder.target, progress=cfg.progress, quant=cfg.settings.draft_quant)
        return LoadedModels(decoder, draft)
    decoder = SpecDecoder.from_pretrained(
        cfg.model, method="ar", dtype=cfg.dtype, device=cfg.resolved_device, options=options, progress=cfg.progress
    )
    if decoder.tokenizer is None:
        raise ValueError(f"model {cfg.model!r} has no tokenizer; the benchmark needs one")
    draft = None
    if cfg.settings.draft_model and (ours_need_draft or hf_assisted_here):
        draft = load_draft_model(
            cfg.settings.draft_model, cfg.dtype, decoder.target.device, progress=cfg.progress, target_tokenizer=decoder.tokenizer,
            quant=cfg.settings.draft_quant,
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
            draft_gguf = cfg_draft_gguf(cfg) if name == "llama-speculative" else None
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
    assert model is not None
    return str(gguf_path(model, progress=progress))


def cfg_draft_gguf(cfg: BenchConfig) -> str:
    """The draft model's GGUF as our methods load it (requantized as ``--draft-quant`` says),
    which ``llama-speculative`` gets too: both draft with the same file."""
    return str(draft_gguf(gguf_of(cfg.settings.draft_model, cfg.progress), cfg.settings.draft_quant, progress=cfg.progress))


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
    settings = VLLMSettings(
        model=resolve_model(cfg.model, progress=cfg.progress), python=cfg.resolved_vllm_python,
        num_speculative_tokens=cfg.vllm_spec_tokens, datastores=tuple(cfg.settings.datastores),
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
    results, stored = open_results(cfg)

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
        model=cfg.model, dtype=cfg.dtype, device=cfg.resolved_device, threads=cfg.threads, draft_model=cfg.settings.draft_model,
        draft_quant=cfg.hf_draft_quant, peers=cfg.process_peers, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
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
    models = load_models(cfg, options)
    if not processes:
        processes += [p for p in [start_peer_process(cfg, console, sorted(models.decoder.engine.eos_token_ids))] if p is not None]
    peer_process = processes[0] if processes else None
    methods = build_methods(cfg, models, options, peer_process)
    packages = ("llama_cpp_python",) if cfg.resolved_backend == "llamacpp" or cfg.llamacpp_peers else ()
    session = Session(session_id(), cfg, environment(cfg.resolved_dtype, packages), models.decoder)
    if cfg.settings.datastores:
        session.stores = tuple(load_datastores(cfg.settings.datastores, models.decoder.tokenizer))

    has_template = bool(getattr(models.decoder.tokenizer, "chat_template", None))
    notes = list(suite.notes)
    if not has_template and any(p.chat for p in suite.prompts):
        notes.append(f"{cfg.model} has no chat template: every prompt is given as raw text")
    for note in notes:
        console.print(f"[yellow]notice:[/yellow] {note}")
    info = write_run_info(cfg, suite, session, notes, llamacpp_info(cfg, models))
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
