"""From ``results.jsonl`` to ``report.md``: tables per task and overall, and the plots.

Definitions used in every table (the report states them too):

- **speedup** of a method on a task = total ``ar`` time / total method time, summed over the
  task's generations (prompt, turn) that both ran; the overall speedup is the same ratio over all
  generations. ``vs own plain`` is the same ratio with the peer's own engine's plain decoding as
  the baseline: HF plain ``generate`` (``hf``) for the HF peers, plain vLLM (``vllm``) for the vLLM peers.
  When the run was bracketed (``ar-end`` rows: ``ar`` again after every other method on the same
  input), a generation's ``ar`` time is the mean of its two ``ar`` runs. Rows pair with the
  baselines measured in their own session (a resumed session measures them again).
- **decode speedup** = the same ratio with each generation's prefill taken out (our methods only).
- **MAT** = total new tokens / total steps, bonus token included; peers have no observable steps.
- **tokens/s** = total new tokens / total generation time.
- **agreement** with ``ar`` on the same input ids: exact outputs out of all generations, the mean
  fraction of equal positions, and the earliest first divergence.
- **retrieval ceiling** = READER's self-repetition metric over the ``ar`` outputs of the task
  (:mod:`specgraft.bench.repetition`).

Example::

    summary = summarize(read_rows(Path("bench-out/results.jsonl")))
    summary.cell("pld", "overall").speedup
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from specgraft.bench.plots import write_plots
from specgraft.bench.records import RESULTS_FILE, read_rows
from specgraft.bench.summary import LLAMACPP_PLAIN, OVERALL, PHASES, Summary, common_rows, summarize

DEFINITIONS = """\
- **speedup** (per task) = total `ar` time / total method time over the task's generations (each prompt and turn); **overall** = the same ratio over all generations. `vs own plain` uses the peer's own engine's plain decoding as the baseline instead of our `ar`: HF plain `generate` (`hf`) for the `hf-*` peers, plain vLLM (`vllm`, run in vLLM's own venv over the same token ids) for the `vllm-*` peers. In a bracketed run `ar` runs twice on every input, first and last (`ar-end`), and its time is the mean of the two, so a drift of the machine's speed during a prompt cancels to first order; the *baseline drift* table shows how far the two runs differed. A resumed session that adds methods to an input runs `ar` again, and each row is compared with the `ar` of its own session.
- **decode speedup** = the same ratio with each generation's prefill time taken out (`ar` time - `ar` prefill) / (method time - method prefill); only for our methods, whose engine times its prefill (including the first step's forward when it carries the prompt or its last part: `SpecEngine.start`, `fused_head`). Long prompts (summarization, RAG) spend much of their time in prefill on a CPU.
- **MAT** = new tokens / steps, **bonus token included**; HF peers expose no steps, so their MAT is `-`; for vLLM peers steps = new tokens - accepted draft tokens (vLLM's spec-decode counters).
- **tokens/s** = new tokens / generation time (prefill included), `time.perf_counter()` around generation only, after a warm-up, every method in the same process with the same dtype and threads.
- **exact vs own plain** (peers): outputs equal token for token to their own engine's plain greedy output (`hf` / `vllm`) on the same input ids.
- **agreement** with `ar` on the same input ids: exact outputs / generations, mean fraction of equal positions, earliest first divergence (token index). Greedy verification is lossless, but a pass over several rows and a one-row pass round differently (bf16 much more than fp32), so outputs may drift after a near-tie.
- **retrieval ceiling** = READER's self-repetition metric (sec. 4.1) over the `ar` outputs: response tokens / pointer advances when each advance takes the longest continuation found in the input or the already-processed output; the MAT an infinite retrieval tree over prompt + history would reach (without counting a bonus token). **ceiling with the datastores** (runs with `--datastore`): the same when a continuation may also be found in the run's datastores, followed by a token there (READER's Table 1, "W/ DS"); a large corpus matches some short n-gram almost anywhere, so this bounds far above what one retrieved path per step accepts.
- Each method has its own engine over the one loaded model and runs one short warm-up generation on a prompt outside the suites. What drafters learn within a generation (Token Recycling's and Graft's successor matrix, `pld`'s copy rates) starts again from the shared state (priors, `--recycling-state`, the calibration's matrix) on every input (`--learning request`, the default since the core issue), so a row does not depend on the inputs before it; runs made with `--learning shared` (and runs that predate the option) keep that state through the run, in prompt order.
- Absolute times on a shared machine are noisy; ratios measured in one run are the meaningful figures."""

LLAMACPP_DEFINITIONS = """\
- **llama.cpp peers**: `llamacpp` is llama-cpp-python's `Llama.generate`, greedy, one row per decode: llama.cpp's own one-row plain decoding, on the same GGUF, token ids, threads and EOS ids as our methods, in the peers' process; `llamacpp-pld` adds llama-cpp-python's `LlamaPromptLookupDecoding` (which makes it keep every prompt row's logits, as its users pay); `llama-speculative` and `llama-lookup` are llama.cpp's own programs, one process per generation, given the prompt as text (our ids detokenized; `method_config.prompt.same_ids` says whether llama.cpp tokenized it back to the same ids) and timed by their own clocks (prompt processing + generation loop, model loading excluded); their text is tokenized by our tokenizer. Their steps: decodes (`n_predict - n_accept`).
- **speedup vs llama.cpp plain** = `llamacpp` time / method time over the same generations; **exact vs llama.cpp plain**: outputs equal to `llamacpp`'s token for token (mean fraction of equal positions in brackets). On the llama.cpp backend our `ar` is llama.cpp's one-row plain decoding through specgraft's engine; in strict mode it is padded to 8 rows per forward (every method then equals it token for token), so `llamacpp` is the speed bar."""


# -- markdown ------------------------------------------------------------------------------


def peer_label(method: str) -> str:
    """
    >>> peer_label("hf-pld"), peer_label("vllm-ngram"), peer_label("llama-lookup")
    ('hf-pld (HF)', 'vllm-ngram (vLLM)', 'llama-lookup (llama.cpp)')
    """
    if method == "vllm" or method.startswith("vllm-"):
        return f"{method} (vLLM)"
    if method == LLAMACPP_PLAIN or method.startswith(("llamacpp-", "llama-")):
        return f"{method} (llama.cpp)"
    return f"{method} (HF)"


def has_llamacpp_plain(summary: Summary) -> bool:
    """Whether the ``llamacpp`` peer ran: the tables then compare every row with it."""
    return LLAMACPP_PLAIN in summary.methods


def _f(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def task_table(summary: Summary, task: str) -> list[str]:
    """Markdown rows: one per method on ``task``; ``ar``, the baseline, shows ``-`` for its speedups
    over itself."""
    header = [
        "method", "MAT (bonus incl.)", "tokens/s", "speedup vs ar", "speedup vs own plain", "decode speedup vs ar",
        "exact", "equal positions", "first divergence", "exact vs own plain",
    ]
    plain = has_llamacpp_plain(summary)
    if plain:
        header += ["speedup vs llama.cpp plain", "exact vs llama.cpp plain"]
    out = []
    for m in summary.methods:
        c = summary.cell(m, task)
        if c is None:
            continue
        baseline = m == "ar"  # its speedup over itself is 1 by definition: a dash, not "1.00x"
        extra = []
        if plain:
            measured = c.plain_time_s is not None
            extra = [
                _f(None if m == LLAMACPP_PLAIN else c.speedup_plain, suffix="x"),
                f"{c.exact_plain}/{c.generations} ({100 * c.mean_fraction_equal_plain:.1f}%)" if measured else "-",
            ]
        out.append([
            peer_label(m) if c.peer else m,
            _f(c.mat),
            _f(c.tokens_per_s),
            _f(None if baseline else c.speedup, suffix="x"),
            _f(c.speedup_hf, suffix="x"),
            _f(None if baseline else c.decode_speedup, suffix="x"),
            f"{c.exact}/{c.generations}",
            _f(100 * c.mean_fraction_equal, 1, "%"),
            "-" if c.first_divergence is None else str(c.first_divergence),
            f"{c.exact_own}/{c.generations}" if c.peer else "-",
            *extra,
        ])
    return _table(header, out)


def matrix_table(summary: Summary) -> list[str]:
    """Markdown rows: one per task (and ``overall``), one column per method but ``ar``; each cell is
    the speedup over ``ar`` with the MAT in brackets (peers have no MAT), ``-`` where the method did
    not run on the task. Every method side by side in one table, e.g. ``| qa | 1.12x (3.15) | 1.08x |``.
    """
    methods = [m for m in summary.methods if m != "ar"]
    rows = []
    for task in [*summary.tasks, OVERALL]:
        cells = []
        for m in methods:
            c = summary.cell(m, task)
            if c is None:
                cells.append("-")
            else:
                cells.append(_f(c.speedup, suffix="x") + ("" if c.mat is None else f" ({c.mat:.2f})"))
        rows.append([task, *cells])
    return _table(["task", *methods], rows)


def ceiling_table(summary: Summary) -> list[str]:
    """Measured MAT of each registry method beside the retrieval ceiling, per task."""
    ours = [m for m in summary.methods if not summary.cells[(m, OVERALL)].peer and m != "ar"]
    with_ds = bool(summary.ceiling_ds)
    header = ["task", "prompts", "retrieval ceiling (self-repetition)", *(["ceiling with the datastores"] if with_ds else []),
              *[f"MAT {m}" for m in ours]]
    rows = []
    for task in [*summary.tasks, OVERALL]:
        sr, ds = summary.ceiling.get(task), summary.ceiling_ds.get(task)
        rows.append([
            task, str(summary.prompts[task]), _f(sr.value if sr else None), *([_f(ds.value if ds else None)] if with_ds else []),
            *[_f(c.mat) if (c := summary.cell(m, task)) else "-" for m in ours],
        ])
    return _table(header, rows)


def drift_table(summary: Summary) -> list[str]:
    """How far the second ``ar`` run of each input differed from the first, per task (one pair per
    input and session: a resumed session that measured an input's baselines again adds a pair).

    >>> s = Summary([], ["t"], {}, {}, {}, [], {"t": [1.02, 0.9, 1.1], OVERALL: [1.02, 0.9, 1.1]})
    >>> drift_table(s)[2]
    '| t | 3 | 1.02 | 0.90 | 1.10 | 7.3% |'
    """
    rows = []
    for task in [*summary.tasks, OVERALL]:
        ratios = sorted(summary.drift.get(task, []))
        if not ratios:
            continue
        median = ratios[len(ratios) // 2] if len(ratios) % 2 else (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
        spread = sum(abs(x - 1) for x in ratios) / len(ratios)
        rows.append([task, str(len(ratios)), _f(median), _f(ratios[0]), _f(ratios[-1]), _f(100 * spread, 1, "%")])
    return _table(["task", "ar / ar-end pairs", "median ar-end / ar time", "min", "max", "mean absolute difference"], rows)


def source_table(summary: Summary) -> list[str]:
    rows = []
    for m in summary.methods:
        c = summary.cells[(m, OVERALL)]
        for s, n in sorted(c.proposed_by_source.items()):
            a = c.accepted_by_source.get(s, 0)
            rows.append([m, s, str(n), str(a), _f(100 * a / n if n else None, 1, "%"),
                         _f(n / c.steps if c.steps else None, 1)])
    return _table(["method", "source", "proposed nodes", "accepted nodes", "acceptance", "nodes per step"], rows)


def time_table(summary: Summary) -> list[str]:
    rows = []
    for m in summary.methods:
        c = summary.cells[(m, OVERALL)]
        per_tok = 1000 * c.time_s / c.new_tokens if c.new_tokens else None
        if c.phase_s:
            total = sum(c.phase_s[p] for p in PHASES)
            shares = [_f(100 * c.phase_s[p] / total if total else None, 1, "%") for p in PHASES]
        else:
            shares = ["-"] * len(PHASES)
        rows.append([peer_label(m) if c.peer else m, _f(per_tok), *shares])
    return _table(["method", "ms per new token", *PHASES], rows)


def _cpu_id(cpu: dict | None) -> str:
    """`` (AuthenticAMD family 25 model 1, avx2)`` from ``environment()['cpu']``; empty for runs
    that predate it.

    >>> _cpu_id({"vendor": "AuthenticAMD", "family": 25, "model": 1, "vector": "avx2"}), _cpu_id(None)
    (' (AuthenticAMD family 25 model 1, avx2)', '')
    """
    if not cpu:
        return ""
    what = " ".join(str(x) for x in (cpu.get("vendor"), "family", cpu.get("family"), "model", cpu.get("model")) if x is not None)
    return f" ({what}" + (f", {cpu['vector']}" if cpu.get("vector") else "") + ")"


def _dtype(cfg: dict) -> str:
    """``"float32 (auto)"`` when ``auto`` was resolved, else the dtype."""
    resolved = cfg.get("resolved_dtype") or cfg.get("dtype")
    return f"{resolved} ({cfg['dtype']})" if cfg.get("dtype") not in (None, resolved) else str(resolved)


def _budgets(cfg: dict) -> str:
    """``"ar 1, pld 8"`` from a run's resolved budgets (runs before they were recorded: one number)."""
    budgets = cfg.get("budgets")
    if not budgets:
        return str(cfg.get("budget"))
    return ", ".join(f"{m} {b}" for m, b in budgets.items())


def llamacpp_line(run_info: dict) -> str | None:
    """The report's line on the llama.cpp side of a run (None when nothing of llama.cpp ran).

    >>> llamacpp_line({"config": {"resolved_backend": "llamacpp"}, "llamacpp": {"gguf": "/m/q.gguf",
    ...     "quantization": "qwen2 1.5B Q4_K - Medium", "threads": 2, "n_ctx": 8192, "strict": False, "peer_threads": 2}})[:62]
    '- llama.cpp: our methods run on `q.gguf` (qwen2 1.5B Q4_K - Me'
    """
    info = run_info.get("llamacpp")
    cfg = run_info.get("config") or {}
    if not info:
        return None
    if cfg.get("resolved_backend") != "llamacpp":
        return f"- llama.cpp peers: {info.get('peer_threads')} threads" + (f", programs from `{info['tools']}`" if info.get("tools") else "")
    line = f"- llama.cpp: our methods run on `{Path(info['gguf']).name}` ({info['quantization']})"
    if info.get("draft"):
        line += f", draft `{Path(info['draft']['gguf']).name}` ({info['draft']['quantization']})"
    line += f", {info['threads']} threads, {info['n_ctx']} context cells; "
    if info.get("strict"):
        line += ("strict mode: `ar` is padded to 8 rows per forward and every method equals it token for token; "
                 "the speed bar is `llamacpp`, llama.cpp's own one-row plain decoding")
    else:
        line += ("`ar` is llama.cpp's one-row plain decoding through specgraft's engine (other methods verify batches of "
                 "rows, whose kernels can round differently: agreement is measured)")
    if info.get("tools"):
        line += f"; llama.cpp programs from `{info['tools']}`"
    return line


def llamacpp_notes(rows: Sequence) -> list[str]:
    """Notes on the llama.cpp programs' rows: inputs whose text llama.cpp tokenized to other ids."""
    differ = [r for r in rows if ((r.config or {}).get("method_config") or {}).get("prompt", {}).get("same_ids") is False]
    if not differ:
        return []
    inputs = sorted({(r.prompt_id, r.turn) for r in differ})
    return [
        f"llama.cpp tokenized the text of {len(inputs)} input(s) to other ids than ours, so its programs ran on another "
        f"tokenization there ({', '.join(f'{p} turn {t + 1}' for p, t in inputs[:5])}{', ...' if len(inputs) > 5 else ''})"
    ]


def render_markdown(
    summary: Summary, run_info: dict | None = None, plots: Sequence[str] = (), common: Summary | None = None,
    extra_notes: Sequence[str] = (),
) -> str:
    """The report; ``common`` (a summary of :func:`common_rows`) adds an overall table over the inputs
    every method ran, for runs whose methods cover different inputs; ``extra_notes`` join the notes."""
    run_info = run_info or {}
    lines = ["# specgraft benchmark", ""]
    if run_info.get("command"):
        lines += ["```", run_info["command"], "```", ""]
    env = run_info.get("environment") or {}
    cfg = run_info.get("config") or {}
    if env or cfg:
        pk = env.get("packages", {})
        lines += [
            f"- model `{cfg.get('model')}`"
            + (f", draft model `{cfg['draft_model']}`" if cfg.get("draft_model") else "")
            + f", dtype {_dtype(cfg)}, temperature {cfg.get('temperature')}"
            + f", max new tokens {cfg.get('max_new_tokens')}, budget (nodes per step) {_budgets(cfg)}",
            f"- machine: {env.get('cpu_model')}{_cpu_id(env.get('cpu'))}, {env.get('cpu_count')} CPUs, torch threads {env.get('torch_threads')}; {env.get('platform')}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in pk.items() if v)
            + (f"; specgraft revision {env['specgraft_revision']}" if env.get("specgraft_revision") else ""),
            f"- suites: {', '.join(run_info.get('suite', {}).get('sources', []))}",
            "",
        ]
        llama = llamacpp_line(run_info)
        if llama:
            lines.insert(len(lines) - 1, llama)
    lines += ["## Definitions", "", DEFINITIONS, ""]
    if run_info.get("llamacpp") or any(peer_label(m).endswith("(llama.cpp)") for m in summary.methods):
        lines[-1:-1] = [LLAMACPP_DEFINITIONS]
    sr = summary.ceiling.get(OVERALL)
    lines += [f"## Overall ({summary.prompts[OVERALL]} prompts; retrieval ceiling {_f(sr.value if sr else None)})", ""]
    lines += task_table(summary, OVERALL) + [""]
    if common is not None:
        n_gen = ar.generations if (ar := common.cell("ar", OVERALL)) else 0
        lines += [
            f"## Overall on the inputs every method ran ({common.prompts.get(OVERALL, 0)} prompts, {n_gen} generations)",
            "",
            "Methods above ran on different inputs (a resumed run that added prompts for some methods only); "
            "this table compares all of them on the same ones.",
            "",
        ] + task_table(common, OVERALL) + [""]
    side = common if common is not None else summary
    lines += [
        "## Every method by task: speedup over `ar` (MAT)"
        + (" on the inputs every method ran" if common is not None else ""),
        "",
    ] + matrix_table(side) + [""]
    if summary.drift:
        lines += [
            "## Baseline drift",
            "",
            "`ar` ran twice on every input, before and after the other methods; the ratio of the two times shows how much "
            "the machine's speed moved during a prompt (speedups use their mean).",
            "",
        ] + drift_table(summary) + [""]
    lines += ["## MAT beside the retrieval ceiling", ""] + ceiling_table(summary) + [""]
    for task in summary.tasks:
        sr = summary.ceiling.get(task)
        gens = summary.cells.get(("ar", task))
        n_gen = gens.generations if gens else 0
        lines += [f"## {task} ({summary.prompts[task]} prompts, {n_gen} generations; retrieval ceiling {_f(sr.value if sr else None)})", ""]
        lines += task_table(summary, task) + [""]
    lines += ["## Acceptance by source (all tasks)", ""] + source_table(summary) + [""]
    lines += ["## Time breakdown (all tasks; shares of the engine's time)", ""] + time_table(summary) + [""]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    notes = list(run_info.get("notes", [])) + list(extra_notes)
    if len(summary.sessions) > 1:
        notes.append(f"rows come from {len(summary.sessions)} sessions (a resumed run): {', '.join(summary.sessions)}")
    if cfg.get("temperature"):
        notes.append("sampling (temperature > 0): outputs are not expected to agree with `ar` token for token")
    if (cfg.get("rounds") or 1) > 1:
        notes.append(
            f"every input ran {cfg['rounds']} rounds, the methods between `ar` and `ar-end` in reverse order every other "
            "round; a row's time is the mean of its rounds (`round_times_s`), its tokens and steps its first round's"
        )
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def write_report(out_dir: str | Path) -> Path:
    """Render ``report.md`` and ``plots/*.png`` from ``out_dir/results.jsonl``; returns the report path."""
    out_dir = Path(out_dir)
    if not (out_dir / RESULTS_FILE).exists():
        raise ValueError(f"{out_dir}: no {RESULTS_FILE} here; pass the --out directory of a benchmark run")
    rows = read_rows(out_dir / RESULTS_FILE)
    if not rows:
        raise ValueError(f"{out_dir / RESULTS_FILE} has no results")
    run_file = out_dir / "run.json"
    run_info = json.loads(run_file.read_text()) if run_file.exists() else {}
    summary = summarize(rows)
    shared = common_rows(rows)
    common = summarize(shared) if shared and len(shared) < len(rows) else None
    plots = write_plots(summary, out_dir / "plots")
    report = out_dir / "report.md"
    report.write_text(render_markdown(summary, run_info, [str(p.relative_to(out_dir)) for p in plots], common, llamacpp_notes(rows)))
    return report
