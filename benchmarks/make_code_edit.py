"""Build ``specgraft/data/code_edit.jsonl``: code-editing (bug-fix) prompts made from HumanEval.

**Writes package data**: the ``code-edit`` suite shipped in the wheel (``make -C benchmarks code-edit``).

Input-guided generation: the answer is the prompt's program with one token-sized fix, so a
prompt-lookup drafter can copy most of it from the input (the setting of CodeEditorBench's
"debug" task, which the AdaPLD paper evaluates on). Everything is built offline from the packaged
``specgraft/data/humaneval.jsonl`` (openai/human-eval, MIT).

Selection, fixed and deterministic: HumanEval problems in stride-4 order (0, 4, 8, ..., 160, then
1, 5, 9, ...); the first ``--count`` (40) of them that have a usable mutation are kept, written in
that order. For each problem the full program is ``prompt + canonical_solution`` and ONE bug is
injected in the canonical solution (never in the signature, docstring or a helper the prompt
defines) by one of these single-token text edits, located with ``tokenize``/``ast`` so the rest
of the text (comments, spacing) is kept byte for byte:

- ``comparison``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``
- ``and_or``: ``and`` <-> ``or``
- ``return_bool``: ``return True`` <-> ``return False``
- ``plus_minus``: a binary ``+`` -> ``-`` (unless a side is plainly a string: a literal, ``str(...)``,
  ``"".join(...)``...), or a binary ``-`` -> ``+``
- ``remove_not``: drop a ``not`` (``not x`` -> ``x``, ``not in`` -> ``in``, ``is not`` -> ``is``)
- ``off_by_one``: an int literal in a ``range(...)`` bound or a subscript index / slice bound
  moved by one, ``+ 1`` / ``- 1`` appended to a ``range`` stop, or the ``k`` of a stop ``n + k`` /
  ``n - k`` moved by one (``n + 1`` -> ``n``, ``len(s) - 2`` -> ``len(s) - 3``)

A mutation is usable when the program still parses, HumanEval's own ``check`` passes on the
original and fails (non-zero exit, not a timeout) on the mutated program; each check runs in a
fresh ``python -I -S`` subprocess with a timeout. Which usable mutation a problem gets: mutation
types are ranked by how often they were already chosen (fewest first, ties broken by a per-problem
RNG seeded with ``"<seed>:<HumanEval number>"``) and the first usable site, in the RNG's order, of
the best-ranked type is taken. Output is byte-identical for the same inputs and ``--seed``.

``--no-check`` skips the subprocesses (every parsing mutation counts as usable) for quick
experiments; its output differs from the checked, packaged file.

    python benchmarks/make_code_edit.py                    # writes specgraft/data/code_edit.jsonl
    python benchmarks/make_code_edit.py --out /tmp/x.jsonl --jobs 8
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import random
import subprocess
import sys
import tokenize
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HUMANEVAL = ROOT / "specgraft" / "data" / "humaneval.jsonl"
OUT = ROOT / "specgraft" / "data" / "code_edit.jsonl"

COUNT = 40
SEED = 0
STRIDE = 4
TIMEOUT_S = 3.0  # a mutant that runs longer (an endless loop) is not used
ORIGINAL_TIMEOUT_S = 30.0  # generous: the originals all finish in well under a second

INSTRUCTION = "Fix the bug in this Python function. Reply with the complete corrected function only."
TYPES = ("comparison", "and_or", "return_bool", "plus_minus", "remove_not", "off_by_one")
COMPARE_FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


@dataclass(frozen=True)
class Mutation:
    kind: str
    line: int  # 1-based line of the edit in the program
    start: int  # character columns [start, end) on that line are replaced by ``new``
    end: int
    new: str
    what: str  # short description, e.g. "`<` -> `<=`"

    def apply(self, program: str) -> str:
        lines = program.splitlines(keepends=True)
        s = lines[self.line - 1]
        lines[self.line - 1] = s[: self.start] + self.new + s[self.end :]
        return "".join(lines)

    def describe(self, first_solution_line: int) -> str:
        return f"{self.kind}: {self.what} (line {self.line - first_solution_line + 1} of the function body)"


def _char_col(line: str, byte_col: int) -> int:
    """ast columns are UTF-8 byte offsets; text edits need character offsets."""
    return len(line.encode("utf-8")[:byte_col].decode("utf-8"))


def _is_int(node: ast.AST) -> int | None:
    """The value of an int literal, ``-k`` included; None for anything else."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _is_int(node.operand)
        return -v if v is not None else None
    return None


def _is_str(node: ast.AST) -> bool:
    """Plainly a string: a literal, an f-string, ``str(...)``, ``"".join(...)``, or ``+``/``*`` on one."""
    if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        return (isinstance(f, ast.Name) and f.id == "str") or (isinstance(f, ast.Attribute) and _is_str(f.value))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        return _is_str(node.left) or _is_str(node.right)
    return False


def candidate_mutations(program: str, first_line: int) -> list[Mutation]:
    """Every single-edit mutation on lines >= ``first_line`` (the canonical solution), in source
    order."""
    lines = program.splitlines(keepends=True)
    tree = ast.parse(program)
    out: list[Mutation] = []

    # (line, byte col, op) where the left operand of a binary `+`/`-` ends; neither side plainly a string
    plus_after: list[tuple[int, int, str]] = []
    # int literals that are range bounds or indices, with what they are
    int_sites: list[tuple[ast.AST, str]] = []
    range_stops: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            if not (_is_str(node.left) or _is_str(node.right)):
                plus_after.append((node.left.end_lineno, node.left.end_col_offset, "+" if isinstance(node.op, ast.Add) else "-"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            if 1 <= len(node.args) <= 3 and not node.keywords:
                bounds = node.args[:2]
                for b in bounds:
                    if _is_int(b) is not None:
                        int_sites.append((b, "range bound"))
                stop = node.args[0] if len(node.args) == 1 else node.args[1]
                if _is_int(stop) is None:
                    range_stops.append(stop)
                # (the step, a third argument, is left alone)
        elif isinstance(node, ast.Subscript):
            sl = node.slice
            if isinstance(sl, ast.Slice):
                for b in (sl.lower, sl.upper):
                    if b is not None and _is_int(b) is not None:
                        int_sites.append((b, "slice bound"))
            elif _is_int(sl) is not None:
                int_sites.append((sl, "index"))

    def in_body(lineno: int) -> bool:
        return lineno >= first_line

    # token-level edits
    toks = list(tokenize.generate_tokens(io.StringIO(program).readline))
    significant = [t for t in toks if t.type not in (tokenize.NL, tokenize.COMMENT)]

    def byte_pos(pos: tuple[int, int]) -> tuple[int, int]:
        return pos[0], len(lines[pos[0] - 1][: pos[1]].encode("utf-8"))

    # the operator of a BinOp is the first `+`/`-` token after its left operand (which may be
    # followed by closing parentheses)
    op_tokens = {op: sorted(byte_pos(t.start) for t in significant if t.type == tokenize.OP and t.string == op) for op in "+-"}
    binop_at = {next(p for p in op_tokens[op] if p >= (line, col)) for line, col, op in plus_after}
    for i, t in enumerate(significant):
        (row, col), (erow, ecol) = t.start, t.end
        if not in_body(row) or row != erow:
            continue
        if t.type == tokenize.OP and t.string in COMPARE_FLIP:
            new = COMPARE_FLIP[t.string]
            out.append(Mutation("comparison", row, col, ecol, new, f"`{t.string}` -> `{new}`"))
        elif t.type == tokenize.NAME and t.string in ("and", "or"):
            new = "or" if t.string == "and" else "and"
            out.append(Mutation("and_or", row, col, ecol, new, f"`{t.string}` -> `{new}`"))
        elif t.type == tokenize.NAME and t.string in ("True", "False"):
            prev = significant[i - 1] if i else None
            nxt = significant[i + 1] if i + 1 < len(significant) else None
            if prev is not None and prev.string == "return" and nxt is not None and nxt.type == tokenize.NEWLINE:
                new = "False" if t.string == "True" else "True"
                out.append(Mutation("return_bool", row, col, ecol, new, f"`return {t.string}` -> `return {new}`"))
        elif t.type == tokenize.OP and t.string in ("+", "-"):
            if byte_pos(t.start) in binop_at:
                new = "-" if t.string == "+" else "+"
                out.append(Mutation("plus_minus", row, col, ecol, new, f"`{t.string}` -> `{new}`"))
        elif t.type == tokenize.NAME and t.string == "not":
            # drop `not` and the blank(s) after it (or before it, for `is not`)
            line = lines[row - 1]
            prev = significant[i - 1] if i else None
            if prev is not None and prev.string == "is" and prev.end[0] == row:
                s, e, what = prev.end[1], ecol, "`is not` -> `is`"
            else:
                e = ecol
                while e < len(line) and line[e] == " ":
                    e += 1
                nxt = significant[i + 1].string if i + 1 < len(significant) else ""
                s, what = col, ("`not in` -> `in`" if nxt == "in" else "removed `not`")
            out.append(Mutation("remove_not", row, s, e, "", what))

    # off-by-one on int literals
    for node, where in int_sites:
        if not in_body(node.lineno) or node.lineno != node.end_lineno:
            continue
        line = lines[node.lineno - 1]
        s, e = _char_col(line, node.col_offset), _char_col(line, node.end_col_offset)
        v = _is_int(node)
        for new_v in (v + 1, v - 1):
            if where != "range bound" and (v >= 0) != (new_v >= 0):
                continue  # x[0] -> x[-1] or x[:-1] -> x[:0] is not an off-by-one
            out.append(Mutation("off_by_one", node.lineno, s, e, str(new_v), f"{where} `{line[s:e]}` -> `{new_v}`"))
    for stop in range_stops:
        if not in_body(stop.lineno) or stop.lineno != stop.end_lineno:
            continue
        line = lines[stop.end_lineno - 1]
        s, e = _char_col(line, stop.col_offset), _char_col(line, stop.end_col_offset)
        text = line[s:e]
        k = _is_int(stop.right) if isinstance(stop, ast.BinOp) and isinstance(stop.op, (ast.Add, ast.Sub)) else None
        if k is not None and k > 0:
            # `n + k` / `n - k`: k moved by one, the term dropped when k becomes 0 (`n + 1` -> `n`)
            if stop.left.end_lineno != stop.lineno:
                continue
            le = _char_col(line, stop.left.end_col_offset)
            rs, re_ = _char_col(line, stop.right.col_offset), _char_col(line, stop.right.end_col_offset)
            for new_k in (k + 1, k - 1):
                if new_k:
                    new_text = line[s:rs] + str(new_k)
                    out.append(Mutation("off_by_one", stop.lineno, rs, re_, str(new_k), f"range stop `{text}` -> `{new_text}`"))
                else:
                    out.append(Mutation("off_by_one", stop.lineno, le, e, "", f"range stop `{text}` -> `{line[s:le]}`"))
            continue
        for op in ("+", "-"):
            out.append(Mutation("off_by_one", stop.end_lineno, e, e, f" {op} 1", f"range stop `{text}` -> `{text} {op} 1`"))

    out.sort(key=lambda m: (m.line, m.start, m.kind, m.new))
    return out


def run_check(program: str, test: str, entry_point: str, timeout: float = TIMEOUT_S) -> str:
    """``"pass"``, ``"fail"`` or ``"timeout"`` for HumanEval's ``check`` on ``program``."""
    code = f"{program}\n\n{test}\n\ncheck({entry_point})\n"
    try:
        r = subprocess.run(
            [sys.executable, "-I", "-S", "-"], input=code, text=True, capture_output=True, timeout=timeout,
            env={"PYTHONHASHSEED": "0", "PATH": os.environ.get("PATH", "")},
        )
    except subprocess.TimeoutExpired:
        return "timeout"
    return "pass" if r.returncode == 0 else "fail"


def selection_order(n_problems: int) -> list[int]:
    return [i for r in range(STRIDE) for i in range(r, n_problems, STRIDE)]


def build(count: int = COUNT, seed: int = SEED, check: bool = True, jobs: int = 4,
          source: Path = HUMANEVAL) -> tuple[list[dict], list[str]]:
    """The records and a log of skipped problems."""
    problems = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    order = selection_order(len(problems))
    records: list[dict] = []
    log: list[str] = []
    used: Counter[str] = Counter()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs)) if check else None
    try:
        for idx in order:
            if len(records) >= count:
                break
            rec = problems[idx]
            number = int(rec["id"].split("/")[1])
            prompt, solution = rec["turns"][0], rec["canonical_solution"]
            program = (prompt + solution).rstrip() + "\n"
            first_line = prompt.count("\n") + 1
            rng = random.Random(f"{seed}:{number}")
            cands = candidate_mutations(program, first_line)
            by_kind: dict[str, list[Mutation]] = {k: [m for m in cands if m.kind == k] for k in TYPES}
            for k in TYPES:
                rng.shuffle(by_kind[k])
            ties = {k: rng.random() for k in TYPES}
            ranked = sorted((k for k in TYPES if by_kind[k]), key=lambda k: (used[k], ties[k]))
            tries = [(m, m.apply(program)) for k in ranked for m in by_kind[k]]
            tries = [(m, p) for m, p in tries if _parses(p) and p != program]
            if not tries:
                log.append(f"{rec['id']}: no mutation site")
                continue
            if check:
                orig = run_check(program, rec["test"], rec["entry_point"], ORIGINAL_TIMEOUT_S)
                if orig != "pass":  # never seen with the packaged file
                    log.append(f"{rec['id']}: the original does not pass its test ({orig})")
                    continue
                # in order, a chunk of `jobs` at a time: the first that fails wins (same for any `jobs`)
                ok = []
                for i in range(0, len(tries), max(1, jobs)):
                    chunk = tries[i : i + max(1, jobs)]
                    results = list(pool.map(lambda mp: run_check(mp[1], rec["test"], rec["entry_point"]), chunk))
                    ok = [mp for mp, res in zip(chunk, results) if res == "fail"]
                    if ok:
                        break
            else:
                ok = tries
            if not ok:
                log.append(f"{rec['id']}: no mutation breaks the test ({len(tries)} tried)")
                continue
            mut, buggy = ok[0]
            used[mut.kind] += 1
            records.append({
                "id": f"code_edit-{number}",
                "task": "code_edit",
                "turns": [f"{INSTRUCTION}\n\n```python\n{buggy}```"],
                "chat": True,
                "reference": program,
                "mutation": mut.describe(first_line),
                "mutation_type": mut.kind,
                "source_id": rec["id"],
                "entry_point": rec["entry_point"],
            })
    finally:
        if pool is not None:
            pool.shutdown()
    if len(records) < count:
        raise SystemExit(f"only {len(records)} usable problems, {count} wanted")
    return records, log


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
    except SyntaxError:
        return False
    return True


def dumps(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--count", type=int, default=COUNT)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="parallel test subprocesses")
    ap.add_argument("--no-check", action="store_true", help="skip running HumanEval's tests (output differs)")
    args = ap.parse_args(argv)
    records, log = build(args.count, args.seed, check=not args.no_check, jobs=args.jobs)
    args.out.write_text(dumps(records), encoding="utf-8")
    for line in log:
        print("skipped", line, file=sys.stderr)
    counts = Counter(r["mutation_type"] for r in records)
    print(f"wrote {len(records)} prompts to {args.out}: " + ", ".join(f"{k} {counts[k]}" for k in TYPES if counts[k]))


if __name__ == "__main__":
    main()
