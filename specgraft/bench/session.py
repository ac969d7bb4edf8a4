"""A benchmark run's records: its sessions (one process's share of a run), ``run.json``, resuming
a run where it stopped, each measured generation as a :class:`~specgraft.bench.records.ResultRow`,
and a finished run's plain answers (:func:`plain_answers`)."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence


from specgraft.agreement import agreement
from specgraft.bench.config import RUN_FILE, BenchConfig
from specgraft.bench.contract import BenchMethod, MethodRun
from specgraft.bench.peers import PEERS
from specgraft.bench.records import RESULTS_FILE, ResultRow, read_rows
from specgraft.bench.repetition import self_repetition
from specgraft.suites import BenchPrompt, Suite, conversation_ids, read_prompt_file

def plain_answers(out_dir: str | Path, tokenizer) -> list[tuple[dict[str, Any], list[int]]]:
    """Each plain-decoding (``ar``) output of a finished bench run, first pass, one per prompt
    and turn in the order the run wrote them, as its raw result record with the exact token ids
    the target was given before it (chat template applied as the run did; a later turn holds the
    earlier turns and the model's own answers). Offline analyses of a run's answers start here
    (``benchmarks/measure_ceiling.py``, ``measure_copy_bound.py``, ``measure_reader_oracle.py``)."""
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


SESSIONS = itertools.count(1)


def session_id() -> str:
    """UTC start time, process id and a count of the runs this process started: unique even when
    one process starts two runs within a second (rows pair with the baselines of their session)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}.{next(SESSIONS)}"


# Config fields added after runs were first recorded: their value in a run.json that predates them.
#: Runs made before ``learning`` existed kept every drafter's state across the session's inputs.
#: Before ``draft_quant``, a draft model ran in the target's dtype (a run without one records None).
RECORDED_SINCE = {
    "resolved_draft_quant": lambda before: "none" if before.get("draft_model") else None,
    "preset": "cpu", "sample_drafts": False, "resolved_device": "cpu", "learning": "shared", "datastores": [], "reader_shape": None,
    "vllm_spec_tokens": 5, "row_cost": None, "draft_depth": None, "draft_top_k": None, "draft_extend": None,
    "draft_stop_min": None, "draft_row_cost": None, "draft_copy_ahead": None, "rounds": 1,
    # before peer_process, the peers ran in the bench's own process
    "resolved_peer_process": lambda before: "shared" if any(m in PEERS for m in before.get("run_methods", ())) else None,
    "resolved_backend": "hf", "strict": False, "llamacpp_draft_max": None,
}


def check_resume(out: Path, cfg: BenchConfig) -> None:
    run_file = out / RUN_FILE
    if not run_file.exists():
        return
    before = json.loads(run_file.read_text())["config"]
    diff = {}
    for key, now in cfg.comparable().items():
        default = RECORDED_SINCE.get(key)
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


def open_results(cfg: BenchConfig) -> tuple[Path, dict[tuple[str, int, str], ResultRow]]:
    """The results file and the rows already in it (only with ``resume``)."""
    out = Path(cfg.out)
    results = out / RESULTS_FILE
    if results.exists() and not cfg.resume:
        raise ValueError(f"{results} exists; pass --resume to continue that run or choose another --out")
    if cfg.resume:
        check_resume(out, cfg)
    out.mkdir(parents=True, exist_ok=True)
    stored: dict[tuple[str, int, str], ResultRow] = {}
    for r in read_rows(results, repair=True):
        stored.setdefault(r.key, r)  # the first measurement of a baseline measured again later
    return results, stored


def write_run_info(
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


